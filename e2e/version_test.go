package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	"github.com/sandboxstats/sandboxstats/internal/version"
)

// TestIntegrationVersion: the three binaries built from a git checkout as
// make build builds them (go build -buildvcs=auto) report that checkout's
// commit, commit time and clean tree, the module and the Go that built them:
// statsd --version, statsagent --version, statsctl version (and -o json).
// The checkout is a fresh clone of this repository's HEAD (a git worktree
// is not stamped by the go command).
func TestIntegrationVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and builds the binaries; not under -short")
	}
	gitPath, err := exec.LookPath("git")
	testenv.Need(t, err == nil, "needs git (apt-get install git)")
	git := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.Command(gitPath, append([]string{"-C", dir}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	root := git(".", "rev-parse", "--show-toplevel")
	head := git(root, "rev-parse", "HEAD")
	src := filepath.Join(t.TempDir(), "src")
	git(".", "clone", "-q", root, src)
	git(src, "checkout", "-q", head)
	commitTime, err := time.Parse(time.RFC3339, git(src, "show", "-s", "--format=%cI", head))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-buildvcs=auto", "-o", bin+"/", "./cmd/...")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(bin, name), args...).Output()
		if err != nil {
			t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
		}
		return string(out)
	}
	var info version.Info
	if err := json.Unmarshal([]byte(run("statsctl", "version", "-o", "json")), &info); err != nil {
		t.Fatal(err)
	}
	t.Logf("statsctl version -o json: %+v", info)
	switch {
	case info.Revision != head || info.Modified:
		t.Errorf("revision %q modified %v, want %s unmodified", info.Revision, info.Modified, head)
	case !info.Time.Equal(commitTime.UTC()):
		t.Errorf("time %v, want the commit's %v", info.Time, commitTime.UTC())
	case info.Module != "github.com/sandboxstats/sandboxstats" || !strings.Contains(info.Version, head[:12]):
		t.Errorf("module %q version %q, want the module at a pseudo-version of %s", info.Module, info.Version, head[:12])
	case info.Go != runtime.Version():
		t.Errorf("go %q, want %q", info.Go, runtime.Version())
	}
	for _, name := range []string{"statsd", "statsagent"} {
		out := run(name, "--version")
		for _, want := range []string{name + " " + info.Version + "\n", "revision: " + head + "\n", "modified: false\n", "go:       " + runtime.Version()} {
			if !strings.Contains(out, want) {
				t.Errorf("%s --version lacks %q:\n%s", name, want, out)
			}
		}
	}
	if out := run("statsctl", "--version"); out != run("statsctl", "version") {
		t.Errorf("statsctl --version and statsctl version differ")
	}
}

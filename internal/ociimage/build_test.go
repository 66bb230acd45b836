package ociimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestIntegrationBuildProjectImagesTwice is `make images` twice from one
// commit: every image built twice, the second time from a copy of the
// sources at another path (so a build path leaking into a binary shows) into
// another directory, gives the same digests and byte-identical archives.
// With Go's build cache warm each build is the links and the compression
// (about 7-10 s on a loaded 2-core machine); cold, the first costs minutes.
func TestIntegrationBuildProjectImagesTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every image twice with the go command; not under -short")
	}
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no go command on PATH")
		}
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	copyRoot := copySources(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var builds [2][]Image
	for i, src := range []string{root, copyRoot} {
		start := time.Now()
		imgs, err := BuildProjectImages(ctx, src, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("build %d (from %s): %v", i+1, src, time.Since(start).Round(time.Millisecond))
		builds[i] = imgs
	}
	digests := func(imgs []Image) []string {
		var ds []string
		for _, img := range imgs {
			ds = append(ds, img.Name+" "+img.Digest)
		}
		return ds
	}
	if diff := cmp.Diff(digests(builds[0]), digests(builds[1])); diff != "" {
		t.Errorf("digests of two builds (-first +second):\n%s", diff)
	}
	want := []string{"statsd", "statsagent", "statsnri", "otelcol"}
	for i, img := range builds[0] {
		if i >= len(want) || img.Name != want[i] || img.Ref != Registry+"/"+img.Name+"@"+img.Digest {
			t.Errorf("image %d: %+v, want %s", i, img, want)
		}
		a, err := os.ReadFile(img.Path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(builds[1][i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: archives differ", img.Name)
		}
		// Identical archives from two paths already say no path is inside;
		// this says where one would be.
		_, files := readTar(t, a)
		for name, blob := range files {
			if zr, err := gzip.NewReader(bytes.NewReader(blob)); err == nil {
				if blob, err = io.ReadAll(zr); err != nil {
					t.Fatalf("%s: %s: %v", img.Name, name, err)
				}
			}
			for _, leak := range []string{root, copyRoot} {
				if bytes.Contains(blob, []byte(leak)) {
					t.Errorf("%s: %s holds the build path %s", img.Name, name, leak)
				}
			}
		}
	}
}

// copySources copies what the images are built from (the files git tracks
// under go.mod, go.sum, cmd, internal, proto and the Collector's module) to
// a temporary directory and returns it.
func copySources(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--", "go.mod", "go.sum", "cmd", "internal", "proto", collectorModule).Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		fi, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link, to); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestBaseLayer: the users and groups a pod's securityContext names exist,
// the nonroot user's home is its own, /tmp is sticky.
func TestBaseLayer(t *testing.T) {
	b, err := LayerTar(BaseLayer())
	if err != nil {
		t.Fatal(err)
	}
	hs, files := readTar(t, b)
	for _, tc := range []struct {
		file, line string
	}{
		{"etc/passwd", "root:x:0:0:"},
		{"etc/passwd", "nonroot:x:65532:65532:"},
		{"etc/group", "root:x:0:"},
		{"etc/group", "nonroot:x:65532:"},
		{"etc/group", "sandboxstats:x:2375:"},
	} {
		lines := strings.Split(string(files[tc.file]), "\n")
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, tc.line) }) {
			t.Errorf("%s: no line %q...:\n%s", tc.file, tc.line, files[tc.file])
		}
	}
	want := map[string]header{
		"home/nonroot/": {Name: "home/nonroot/", Type: '5', Mode: 0o700, UID: NonrootUID, GID: NonrootUID},
		"tmp/":          {Name: "tmp/", Type: '5', Mode: 0o1777},
	}
	for _, h := range hs {
		if w, ok := want[h.Name]; ok {
			if diff := cmp.Diff(w, h); diff != "" {
				t.Errorf("%s (-want +got):\n%s", h.Name, diff)
			}
			delete(want, h.Name)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing %v", want)
	}
}

// TestSysusersGroup: the base's sandboxstats group is the one systemd's
// hosts get (deploy/systemd/sandboxstats.sysusers.conf).
func TestSysusersGroup(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", "sandboxstats.sysusers.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(b), "\n"), "g sandboxstats 2375") || SandboxstatsGroup != 2375 {
		t.Errorf("sandboxstats.sysusers.conf does not say g sandboxstats %d:\n%s", SandboxstatsGroup, b)
	}
}

// TestDockerfileBase: the Dockerfile's base holds the same users and groups
// as BaseLayer, and builds the binaries as GoBuild does.
func TestDockerfileBase(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	heredoc := func(dst string) string {
		_, rest, ok := strings.Cut(df, "COPY <<EOT "+dst+"\n")
		body, _, ok2 := strings.Cut(rest, "EOT\n")
		if !ok || !ok2 {
			t.Fatalf("Dockerfile: no COPY <<EOT %s", dst)
		}
		return body
	}
	for _, tc := range []struct{ dst, want string }{
		{"/rootfs/etc/passwd", etcPasswd},
		{"/rootfs/etc/group", etcGroup},
		{"/rootfs/etc/nsswitch.conf", etcNsswitch},
	} {
		if diff := cmp.Diff(tc.want, heredoc(tc.dst)); diff != "" {
			t.Errorf("Dockerfile %s (-BaseLayer +Dockerfile):\n%s", tc.dst, diff)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "go build -trimpath -buildvcs=false", "USER 65532:65532", "chmod 1777 /rootfs/tmp"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
}

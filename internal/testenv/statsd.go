package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const module = "github.com/sandboxstats/sandboxstats"

var builds struct {
	sync.Mutex
	dirs map[string]string // command list -> directory holding the binaries
}

// BuildBinaries builds ./cmd/statsd, ./cmd/statsctl and the extra commands
// (names under ./cmd, e.g. "statsagent") with `go build` into a temporary
// directory and returns it. The build is cached in the test process: calls
// for the same commands share one directory until the cleanup of the test
// that built it removes it (nothing outlives the test binary; a later test
// builds again, which Go's build cache makes a relink).
func BuildBinaries(t testing.TB, extra ...string) string {
	t.Helper()
	cmds := append([]string{"statsd", "statsctl"}, extra...)
	key := strings.Join(cmds, " ")
	builds.Lock()
	defer builds.Unlock()
	if dir, ok := builds.dirs[key]; ok {
		return dir
	}
	dir, err := os.MkdirTemp("", "sandboxstats-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		builds.Lock()
		delete(builds.dirs, key)
		builds.Unlock()
		os.RemoveAll(dir)
	})
	args := []string{"build", "-o", dir + "/"}
	for _, c := range cmds {
		args = append(args, module+"/cmd/"+c)
	}
	if out, err := exec.Command(goTool(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", key, err, out)
	}
	if builds.dirs == nil {
		builds.dirs = map[string]string{}
	}
	builds.dirs[key] = dir
	return dir
}

// Statsd is a real statsd (from BuildBinaries) serving on Unix sockets in a
// temporary directory, with its state in Dir/state and its output in
// Dir/statsd.log. The test's cleanup stops it (SIGTERM, SIGKILL after 10 s)
// and logs statsd.log when the test failed.
type Statsd struct {
	Dir              string
	Stats, Lifecycle string // socket paths: Dir/stats.sock, Dir/lifecycle.sock
	Cmd              *exec.Cmd
}

// StartStatsd starts binDir/statsd with --cgroup-root /sys/fs/cgroup
// --proc-root /proc --read-timeout 2s and extraArgs, and waits up to 10 s
// for both sockets.
func StartStatsd(t testing.TB, binDir string, extraArgs ...string) *Statsd {
	t.Helper()
	d := &Statsd{Dir: t.TempDir()}
	d.Stats = filepath.Join(d.Dir, "stats.sock")
	d.Lifecycle = filepath.Join(d.Dir, "lifecycle.sock")
	logPath := filepath.Join(d.Dir, "statsd.log")
	args := append([]string{"--listen", d.Stats, "--lifecycle-listen", d.Lifecycle, "--state-dir", filepath.Join(d.Dir, "state"),
		"--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc", "--read-timeout", "2s"}, extraArgs...)
	d.Cmd = exec.Command(filepath.Join(binDir, "statsd"), args...)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	d.Cmd.Stdout, d.Cmd.Stderr = logf, logf
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		d.Cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.Cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.Cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("statsd.log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, e1 := os.Stat(d.Stats)
		_, e2 := os.Stat(d.Lifecycle)
		if e1 == nil && e2 == nil {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatal("statsd did not create its sockets within 10 s")
		}
	}
}

// goTool is the go command on PATH (go test puts its own toolchain's bin
// directory there).
func goTool(t testing.TB) string {
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	return p
}

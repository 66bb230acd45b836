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
// builds again, which Go's build cache makes a relink). Where PrebuiltBinEnv
// names a directory (the VM lane's guest, which has no Go), that directory is
// returned once it holds every command.
func BuildBinaries(t testing.TB, extra ...string) string {
	t.Helper()
	cmds := append([]string{"statsd", "statsctl"}, extra...)
	if dir := os.Getenv(PrebuiltBinEnv); dir != "" {
		for _, c := range cmds {
			if _, err := os.Stat(filepath.Join(dir, c)); err != nil {
				t.Fatalf("%s=%s: %v", PrebuiltBinEnv, dir, err)
			}
		}
		return dir
	}
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
	goBuild(t, dir, nil, nil, cmds...)
	if builds.dirs == nil {
		builds.dirs = map[string]string{}
	}
	builds.dirs[key] = dir
	return dir
}

// Statsd is a real statsd (from BuildBinaries) serving on Unix sockets,
// with its output in Log. The test's cleanup stops it (SIGCONT in case it
// was stopped, SIGTERM, SIGKILL after 10 s) and logs its output when the
// test failed.
type Statsd struct {
	Dir              string // its temporary directory (StartStatsd)
	Stats, Lifecycle string // socket paths
	StateDir, Log    string
	Cmd              *exec.Cmd

	bin  string
	args []string
}

// StartStatsd starts binDir/statsd with its sockets (stats.sock,
// lifecycle.sock), state and log in a new temporary directory; see
// StartStatsdAt.
func StartStatsd(t testing.TB, binDir string, extraArgs ...string) *Statsd {
	t.Helper()
	dir := t.TempDir()
	d := StartStatsdAt(t, binDir, filepath.Join(dir, "stats.sock"), filepath.Join(dir, "lifecycle.sock"), filepath.Join(dir, "state"), extraArgs...)
	d.Dir = dir
	return d
}

// StartStatsdAt starts binDir/statsd listening on the given socket paths
// with the given state directory (its log beside the state directory),
// --cgroup-root /sys/fs/cgroup --proc-root /proc --read-timeout 2s and
// extraArgs, and waits up to 10 s for both sockets.
func StartStatsdAt(t testing.TB, binDir, stats, lifecycle, stateDir string, extraArgs ...string) *Statsd {
	t.Helper()
	d := &Statsd{Stats: stats, Lifecycle: lifecycle, StateDir: stateDir, Log: stateDir + ".log", bin: binDir}
	d.args = append([]string{"--listen", stats, "--lifecycle-listen", lifecycle, "--state-dir", stateDir,
		"--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc", "--read-timeout", "2s"}, extraArgs...)
	d.start(t)
	t.Cleanup(func() {
		d.Stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(d.Log)
			t.Logf("%s:\n%s", d.Log, b)
		}
	})
	return d
}

func (d *Statsd) start(t testing.TB) {
	t.Helper()
	d.Cmd = exec.Command(filepath.Join(d.bin, "statsd"), d.args...)
	logf, err := os.OpenFile(d.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	d.Cmd.Stdout, d.Cmd.Stderr = logf, logf
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if Listening(d.Stats) && Listening(d.Lifecycle) {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(d.Log)
			t.Fatalf("statsd did not listen on its sockets within 10 s:\n%s", b)
		}
	}
}

// Listening reports whether a Unix socket bound at path listens, from
// /proc/net/unix (a socket file exists from bind(2) on, before listen(2):
// a dial in between is refused), without connecting to it.
func Listening(path string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return false
	}
	// Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 is
	// __SO_ACCEPTCON, a listening socket.
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 8 && f[7] == path && f[3] == "00010000" {
			return true
		}
	}
	return false
}

// Stop stops statsd (SIGCONT, SIGTERM, SIGKILL after 10 s) and waits for it.
// Stopping a stopped statsd does nothing.
func (d *Statsd) Stop(t testing.TB) {
	if d.Cmd == nil || d.Cmd.ProcessState != nil {
		return
	}
	_ = d.Cmd.Process.Signal(syscall.SIGCONT)
	_ = d.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = d.Cmd.Process.Kill()
		<-done
	}
}

// Restart stops statsd and starts it again with the same sockets, state
// directory and flags.
func (d *Statsd) Restart(t testing.TB) {
	t.Helper()
	d.Stop(t)
	d.start(t)
}

// Crash kills statsd (SIGKILL: no shutdown work) and starts it again with
// the same sockets, state directory and flags.
func (d *Statsd) Crash(t testing.TB) {
	t.Helper()
	if d.Cmd != nil && d.Cmd.ProcessState == nil {
		_ = d.Cmd.Process.Kill()
		_ = d.Cmd.Wait()
	}
	d.start(t)
}

// BuildProgram builds the main package in the module's directory pkg (a
// test-only program kept in a testdata directory, out of ./...: for
// example "e2e/testdata/grpcfloor") into a temporary directory that the
// test's cleanup removes, and returns the binary's path. Where
// PrebuiltBinEnv names a directory, the binary of that name there is
// returned.
func BuildProgram(t testing.TB, pkg string) string {
	t.Helper()
	name := filepath.Base(pkg)
	if dir := os.Getenv(PrebuiltBinEnv); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", PrebuiltBinEnv, dir, err)
		}
		return p
	}
	dir := t.TempDir()
	goBuildPackages(t, dir, nil, nil, module+"/"+pkg)
	return filepath.Join(dir, name)
}

// goBuild builds the module's commands (names under ./cmd) into dir with
// `go build`, flags before the packages and env added to the environment.
func goBuild(t testing.TB, dir string, env, flags []string, cmds ...string) {
	t.Helper()
	pkgs := make([]string, len(cmds))
	for i, c := range cmds {
		pkgs[i] = module + "/cmd/" + c
	}
	goBuildPackages(t, dir, env, flags, pkgs...)
}

// goBuildPackages is goBuild for packages named by import path.
func goBuildPackages(t testing.TB, dir string, env, flags []string, pkgs ...string) {
	t.Helper()
	args := append(append(append([]string{"build"}, flags...), "-o", dir+"/"), pkgs...)
	cmd := exec.Command(goTool(t), args...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
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

package statsdfake

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The environment of a fleet child (see StartFleet): where it serves its
// daemons and how many.
const (
	fleetDirEnv   = "STATSDFAKE_FLEET_DIR"
	fleetCountEnv = "STATSDFAKE_FLEET_COUNT"
)

// FleetSocket is the name of the i-th daemon's socket in a fleet's
// directory; the fleet's glob is "<dir>/d*.sock".
func FleetSocket(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("d%04d.sock", i)) }

// ServeFleet is the body of a package's helper "test" that StartFleet
// re-executes the test binary to run, e.g.
//
//	func TestFleetHelper(t *testing.T) { statsdfake.ServeFleet(t, answer) }
//
// Run normally it skips. As the child it serves the fleet's daemons, the
// i-th answering answer(i) (see SetResponse), says "ready" on stdout and
// serves until stdin closes.
func ServeFleet(t *testing.T, answer func(i int) *sandboxstatsv1.StatsActiveWorkloadsResponse) {
	dir := os.Getenv(fleetDirEnv)
	if dir == "" {
		t.Skip("helper process: the fake daemons statsdfake.StartFleet starts")
	}
	n, err := strconv.Atoi(os.Getenv(fleetCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	// A listener and an accepted connection per daemon, and some to spare.
	EnsureNoFile(t, 2*n+64)
	for i := range n {
		Start(t, FleetSocket(dir, i)).SetResponse(answer(i))
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// StartFleet serves n fake daemons from a child process (the test binary
// re-executed to run only the helper test named helper, whose body is
// ServeFleet) and returns the directory of their sockets. The daemons' CPU
// and memory are the child's: a poller in the test process measures its
// own alone (getrusage RUSAGE_SELF, /proc/self/status). The test's cleanup
// stops the child.
func StartFleet(tb testing.TB, helper string, n int) string {
	tb.Helper()
	dir := tb.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), fleetDirEnv+"="+dir, fleetCountEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		tb.Fatalf("statsdfake: fleet of %d did not start: %q %v", n, sc.Text(), sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return dir
}

// EnsureNoFile raises this process's soft RLIMIT_NOFILE to at least n
// (within the hard limit), failing the test if the hard limit is lower: a
// poller of 1000 daemons holds a socket per daemon, their fleet two.
func EnsureNoFile(tb testing.TB, n int) {
	tb.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		tb.Fatal(err)
	}
	if rl.Cur >= uint64(n) {
		return
	}
	if rl.Max < uint64(n) {
		tb.Fatalf("statsdfake: RLIMIT_NOFILE hard limit %d is below the %d files needed", rl.Max, n)
	}
	rl.Cur = rl.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		tb.Fatalf("statsdfake: raise RLIMIT_NOFILE to %d: %v", rl.Max, err)
	}
}

package gvisor

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOwnTrackerHeldStat: on the real /proc, a checked gofer's stat is held
// open (one pread a read) and, once the process exits and is reaped, that
// descriptor answers ESRCH: the process keeps its last figure, the
// descriptor is closed, and a process that reuses nothing is never read
// through it. close releases what is held.
func TestOwnTrackerHeldStat(t *testing.T) {
	const root = "/run/sbs-held-test"
	// A "gofer" of this test: argv[0] runsc-gofer, --root= the root (a loop
	// long enough that the check sees it before the exec of sleep); the
	// "sentry" is this process (not runsc-sandbox: not counted).
	cmd := exec.Command("/bin/sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 100", "x", "--root="+root)
	cmd.Args[0] = "runsc-gofer"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	gofer := cmd.Process.Pid
	// The check reads argv once: wait until the kernel shows the gofer's
	// (a read between fork and exec would see this test's argv for good).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/cmdline")
		if strings.HasPrefix(string(b), "runsc-gofer\x00") || time.Now().After(deadline) {
			break
		}
	}
	o := newOwnTracker("/proc")
	defer o.close()
	self := os.Getpid()
	var first ownRead
	for range 50 { // until the loop has burnt a tick
		r, err := o.read(root, self, []int{gofer})
		if err != nil {
			t.Fatal(err)
		}
		first = r
		if r.Usec > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if first.Counts != 1 || first.Usec == 0 {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/cmdline")
		t.Fatalf("got %+v, want the gofer counted with some CPU (its cmdline now %q)", first, cmdline)
	}
	o.mu.Lock()
	p := o.procs[gofer]
	held := o.held
	o.mu.Unlock()
	if p.fd < 0 || held != 1 {
		t.Fatalf("the gofer's stat is not held: fd %d, %d held", p.fd, held)
	}
	if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(p.fd)); err != nil || target != "/proc/"+strconv.Itoa(gofer)+"/stat" {
		t.Errorf("the held descriptor is %q (%v), want the gofer's stat", target, err)
	}
	cmd.Process.Kill()
	cmd.Wait() // reaped: the held descriptor now answers ESRCH
	r, err := o.read(root, self, []int{gofer})
	if err != nil {
		t.Fatal(err)
	}
	if r.Usec < first.Usec || r.Counts != 0 {
		t.Errorf("after the gofer exited: %+v, want its last figure (>= %d us) and none counted now", r, first.Usec)
	}
	if _, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(p.fd)); err == nil && o.held != 0 {
		t.Errorf("the descriptor is still held (%d held)", o.held)
	}
	o.close()
	if o.held != 0 {
		t.Errorf("%d held after close", o.held)
	}
}

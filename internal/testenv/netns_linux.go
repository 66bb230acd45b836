package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Listener accepts one TCP connection in a network namespace and counts the
// bytes it receives until the peer closes.
type Listener struct {
	Addr string // host:port, in the namespace
	done chan listenResult
	ln   net.Listener
}

type listenResult struct {
	n   int64
	err error
}

// ListenIn listens on ns.Addr (a free port) inside ns. The socket is made by
// a goroutine locked to a thread that joined ns (setns), so it belongs to ns;
// that thread is never unlocked, so it ends with the goroutine instead of
// going back to the runtime in another namespace. It is never the main
// thread, which Go keeps (as hoststat's private debugfs mount does). The
// test's cleanup closes the listener.
func ListenIn(t testing.TB, ns NetNS, deadline time.Duration) *Listener {
	t.Helper()
	l := &Listener{done: make(chan listenResult, 1)}
	ready := make(chan error, 1)
	var serve func()
	serve = func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Go never discards the main thread: set into ns it would
			// stay there, and the test process with it (/proc/<pid>/ns/net
			// is the main thread's; a CI run found the namespace still
			// held after the test). Hold it while a goroutine that cannot
			// run on it listens, and release it untouched.
			done := make(chan struct{})
			go func() { defer close(done); serve() }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		// No UnlockOSThread from here on: this thread dies with the
		// goroutine.
		f, err := os.Open(ns.Path)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err != nil {
			ready <- fmt.Errorf("setns %s: %w", ns.Path, err)
			return
		}
		if l.ln, err = net.Listen("tcp", net.JoinHostPort(ns.Addr, "0")); err != nil {
			ready <- err
			return
		}
		l.Addr = l.ln.Addr().String()
		ready <- nil
		l.ln.(*net.TCPListener).SetDeadline(time.Now().Add(deadline))
		c, err := l.ln.Accept()
		if err != nil {
			l.done <- listenResult{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(deadline))
		n, err := io.Copy(io.Discard, c)
		l.done <- listenResult{n, err}
	}
	go serve()
	if err := <-ready; err != nil {
		t.Fatalf("listen in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { l.ln.Close() })
	return l
}

// Received waits for the connection to end and returns the bytes it
// carried.
func (l *Listener) Received() (int64, error) {
	r := <-l.done
	return r.n, r.err
}

// Pin restricts every thread of the child to CPU cpu (sched_setaffinity), so
// that children pinned to the same CPU contend for it. Threads the child
// makes later inherit the mask.
func (c *Child) Pin(t testing.TB, cpu int) {
	t.Helper()
	var set unix.CPUSet
	set.Set(cpu)
	for _, tid := range threads(t, c.Cmd.Process.Pid) {
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			t.Fatalf("sched_setaffinity thread %d of the child: %v", tid, err)
		}
	}
}

// SendFromSandbox sends mib MiB of zeros from inside sb (busybox dd, then
// nc) to a listener in ns, and returns what the listener received, its
// address and how long the transfer took. A listener error fails the test.
func SendFromSandbox(t testing.TB, sb *Sandbox, ns NetNS, mib int, deadline time.Duration) (received int64, addr string, took time.Duration) {
	t.Helper()
	ln := ListenIn(t, ns, deadline)
	host, port, _ := strings.Cut(ln.Addr, ":")
	start := time.Now()
	sb.Exec(t, "/bin/sh", "-c", fmt.Sprintf("dd if=/dev/zero of=/tmp/f bs=1M count=%d 2>/dev/null && nc %s %s < /tmp/f", mib, host, port))
	got, err := ln.Received()
	if err != nil {
		t.Fatalf("listener in %s: %v", ns.Name, err)
	}
	return got, ln.Addr, time.Since(start)
}

package sentryusage

import (
	"context"
	"errors"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestDialFullBacklog: a socket whose backlog is full (a sentry that stopped
// accepting) fails the dial at once with EAGAIN, as net.Dial does: no retry
// that would eat the read's time.
func TestDialFullBacklog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // never accepts
		t.Fatal(err)
	}
	var err2 error
	for range 4 { // backlog 0 takes one pending connection
		t0 := time.Now()
		c, err := dialUnix(context.Background(), p)
		if err == nil {
			defer c.Close()
			continue
		}
		if took := time.Since(t0); took > 100*time.Millisecond {
			t.Fatalf("a full backlog took %v to fail", took)
		}
		err2 = err
		break
	}
	if !errors.Is(err2, syscall.EAGAIN) {
		t.Fatalf("full backlog: %v, want EAGAIN", err2)
	}
}

// TestHungSentryParksGoroutines: 32 concurrent Reads of a sentry that never
// answers wait in Go's netpoller (each its own connection: the Session
// keeps one), each ending at its bound, without an OS thread each.
func TestHungSentryParksGoroutines(t *testing.T) {
	root := t.TempDir()
	startFake(t, sockIn(root, busy1.SandboxID), hang)
	s := newSession(t, Config{RootDirs: []string{root}, Timeout: 300 * time.Millisecond})
	threads := pprof.Lookup("threadcreate")
	before := threads.Count()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			if _, err := s.Read(context.Background(), busy1); !errors.Is(err, ErrDeadline) {
				t.Errorf("hung sentry: %v, want ErrDeadline", err)
			}
		})
	}
	wg.Wait()
	if n := threads.Count() - before; n > 8 {
		t.Errorf("%d OS threads made for 32 Reads waiting on a hung sentry, want a few at most", n)
	}
}

package sentryusage

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialFullBacklog: a sentry that never accepts, its backlog full (a
// listen backlog of 0 holds one pending connection), bounds the dial by the
// Read's deadline: ErrDeadline, not a hang and not a busy loop.
func TestDialFullBacklog(t *testing.T) {
	root := t.TempDir()
	addr := sockIn(root, busy1.SandboxID)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	first, err := net.Dial("unix", addr) // the one pending connection
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })

	const bound = 200 * time.Millisecond
	c := newClient(t, Config{RootDirs: []string{root}, Timeout: bound})
	start := time.Now()
	_, err = c.Read(context.Background(), busy1)
	took := time.Since(start)
	if !errors.Is(err, ErrDeadline) {
		t.Fatalf("error %v, want ErrDeadline", err)
	}
	if took < bound || took > bound+slack {
		t.Errorf("took %v, want about the %v bound", took, bound)
	}
	t.Logf("%v after %v", err, took)
}

// TestRawConnDeadline: a Read waiting for bytes ends at the deadline with
// os.ErrDeadlineExceeded, and a Write after a past deadline fails at once.
func TestRawConnDeadline(t *testing.T) {
	root := t.TempDir()
	addr := sockIn(root, "x")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conn, err := dialUnix(context.Background(), time.Now().Add(time.Second), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	var b [8]byte
	if _, err := conn.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read: %v, want os.ErrDeadlineExceeded", err)
	}
	if took := time.Since(start); took < 100*time.Millisecond || took > 100*time.Millisecond+slack {
		t.Errorf("read took %v, want about 100ms", took)
	}
	if _, err := conn.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("write after the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
}

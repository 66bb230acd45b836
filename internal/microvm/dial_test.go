package microvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func TestParseHandshakeLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want uint32
		ok   bool
	}{
		{"cloud hypervisor", "OK 1073741824\n", 1073741824, true},
		{"firecracker", "OK 52\n", 52, true},
		{"largest port", "OK 4294967295\n", 4294967295, true},
		{"no newline", "OK 1073741824", 0, false},
		{"crlf", "OK 1\r\n", 0, false},
		{"lowercase", "ok 1\n", 0, false},
		{"ok without port", "OK\n", 0, false},
		{"ok space only", "OK \n", 0, false},
		{"two spaces", "OK  1\n", 0, false},
		{"negative", "OK -1\n", 0, false},
		{"leading zeros", "OK 0000\n", 0, false},
		{"overflow", "OK 4294967296\n", 0, false},
		{"trailing text", "OK 1 extra\n", 0, false},
		{"contains ok", "NOT OK 1\n", 0, false},
		{"http", "HTTP/1.1 400 Bad Request\r\n", 0, false},
		{"empty", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseHandshakeLine([]byte(tc.in))
			if tc.ok {
				if err != nil || got != tc.want {
					t.Fatalf("parseHandshakeLine(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("parseHandshakeLine(%q) = %d, %v; want an ErrHandshake", tc.in, got, err)
			}
		})
	}
}

// FuzzParseHandshakeLine: no panic; an accepted line is exactly
// "OK <port>\n" with the port it returned.
func FuzzParseHandshakeLine(f *testing.F) {
	for _, s := range []string{"OK 1073741824\n", "OK 1\n", "OK\n", "OK 1", "ok 1\n", "OK 99999999999\n", "\n", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		port, err := parseHandshakeLine(line)
		if err != nil {
			return
		}
		if want := "OK " + strconv.FormatUint(uint64(port), 10) + "\n"; string(line) != want {
			t.Fatalf("accepted %q as port %d (canonical %q)", line, port, want)
		}
	})
}

// vmmSocket is a stand-in for a VMM's hybrid-vsock socket: it reads the
// CONNECT line, checks it, then runs reply on the connection.
func vmmSocket(t *testing.T, reply func(c net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vmm.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); close(done) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, len("CONNECT 1024\n"))
				if _, err := c.Read(buf); err != nil || string(buf) != "CONNECT 1024\n" {
					t.Errorf("VMM read %q, %v; want CONNECT 1024", buf, err)
					return
				}
				reply(c)
				select {
				case <-done:
				case <-time.After(5 * time.Second):
				}
			}()
		}
	}()
	return path
}

func TestDialHybrid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reply  func(c net.Conn)
		want   error // sentinel; nil = success
		detail string
	}{
		{"ok", func(c net.Conn) { c.Write([]byte("OK 1073741824\n")) }, nil, ""},
		{"ok then agent bytes", func(c net.Conn) { c.Write([]byte("OK 1073741824\nTTRPC")) }, nil, ""},
		{"garbage", func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, source.ErrMalformed, `does not start with "OK "`},
		{"closed, nothing listens in the guest", func(c net.Conn) { c.Close() }, source.ErrNotMeasurable, "closed the connection after CONNECT"},
		{"half a line then closed", func(c net.Conn) { c.Write([]byte("OK 12")); c.Close() }, source.ErrNotMeasurable, `read "OK 12"`},
		{"endless line", func(c net.Conn) { c.Write([]byte(strings.Repeat("x", 200))) }, source.ErrMalformed, "no newline"},
		{"never answers", func(c net.Conn) {}, source.ErrTimeout, "i/o timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := vmmSocket(t, tc.reply)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			conn, err := dial(ctx, Address{Scheme: SchemeHybridVsock, Path: path, Port: 1024}, nil)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer conn.Close()
				if tc.name == "ok then agent bytes" {
					buf := make([]byte, 5)
					if _, err := conn.Read(buf); err != nil || string(buf) != "TTRPC" {
						t.Fatalf("first agent bytes = %q, %v; the handshake must not consume them", buf, err)
					}
				}
				return
			}
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded; want an error")
			}
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), tc.detail) || !strings.Contains(err.Error(), path) {
				t.Fatalf("dial error = %v; want %v, ErrHandshake, the socket path and %q", err, tc.want, tc.detail)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("dial took %s; the handshake deadline is 200ms", took)
			}
		})
	}
}

func TestDialHybridNoSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.sock")
	_, err := dial(context.Background(), Address{Scheme: SchemeHybridVsock, Path: path, Port: 1024}, nil)
	if !errors.Is(err, source.ErrNotMeasurable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("dial of a missing socket: %v; want ErrNotMeasurable naming %s", err, path)
	}
}

// The vsock dialer is only ever exercised through an injected function: no
// AF_VSOCK socket is created on this machine.
func TestDialVsockInjected(t *testing.T) {
	addr, err := ParseAddress("vsock://16187:1024")
	if err != nil {
		t.Fatal(err)
	}
	var gotCID, gotPort uint32
	client, server := net.Pipe()
	defer server.Close()
	conn, err := dial(context.Background(), addr, func(_ context.Context, cid, port uint32) (net.Conn, error) {
		gotCID, gotPort = cid, port
		return client, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if gotCID != 16187 || gotPort != 1024 {
		t.Fatalf("injected dialer got cid %d port %d; want 16187 1024", gotCID, gotPort)
	}

	refused := errors.New("connection refused")
	_, err = dial(context.Background(), addr, func(context.Context, uint32, uint32) (net.Conn, error) { return nil, refused })
	if !errors.Is(err, refused) || !errors.Is(err, source.ErrNotMeasurable) || !strings.Contains(err.Error(), "vsock://16187:1024") {
		t.Fatalf("failed vsock dial: %v; want ErrNotMeasurable wrapping the cause and naming the address", err)
	}
}

// deadlineConn reports when a deadline in the past is set on it (what the
// handshake's cancel AfterFunc does).
type deadlineConn struct {
	net.Conn
	pastOnce sync.Once
	past     chan struct{}
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if !t.IsZero() && t.Before(time.Now()) {
		c.pastOnce.Do(func() { close(c.past) })
	}
	return err
}

// TestHandshakeDeadlineAsReplyArrives: when the dial's context ends after
// the VMM's reply was read but before the deadline is cleared, the
// AfterFunc sets a past deadline. The handshake must not then hand out a
// connection whose first ttrpc read fails: it is a timeout. Made
// deterministic with a hook that cancels the context at that point and
// waits for the AfterFunc to have run.
func TestHandshakeDeadlineAsReplyArrives(t *testing.T) {
	for _, cancelInHook := range []bool{true, false} {
		t.Run(fmt.Sprintf("cancel=%v", cancelInHook), func(t *testing.T) {
			client, vmm := net.Pipe()
			defer vmm.Close()
			conn := &deadlineConn{Conn: client, past: make(chan struct{})}
			defer conn.Close()
			go func() {
				buf := make([]byte, len("CONNECT 1024\n"))
				if _, err := io.ReadFull(vmm, buf); err != nil {
					return
				}
				vmm.Write([]byte("OK 1073741824\n"))
				vmm.Write([]byte("TTRPC"))
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hookRan := false
			testHookHandshakeReplied = func() {
				hookRan = true
				if !cancelInHook {
					return
				}
				cancel()
				select {
				case <-conn.past:
				case <-time.After(5 * time.Second):
					t.Error("the AfterFunc did not set a past deadline within 5 s of the cancel")
				}
			}
			t.Cleanup(func() { testHookHandshakeReplied = nil })

			err := handshake(ctx, conn, 1024)
			if !hookRan {
				t.Fatalf("hook did not run (handshake: %v)", err)
			}
			if cancelInHook {
				if !errors.Is(err, source.ErrTimeout) || !errors.Is(err, ErrHandshake) {
					buf := make([]byte, 5)
					_, rerr := conn.Read(buf)
					t.Fatalf("handshake = %v (then first read: %v); want ErrTimeout and ErrHandshake", err, rerr)
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "TTRPC" {
				t.Fatalf("first agent read = %q, %v", buf, err)
			}
		})
	}
}

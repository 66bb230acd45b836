package sentryusage

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func newSession(t testing.TB, cfg Config) *Session {
	t.Helper()
	s := newClient(t, cfg).Session()
	t.Cleanup(func() { s.Close() })
	return s
}

// waitOpen waits until f has want connections open (the client's closes
// reach it a little later).
func waitOpen(t testing.TB, f *fakeSentry, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, open := f.counts()
		if open == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", open, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readN reads n times on s and checks every Usage against want's CPU.
func readN(t *testing.T, s *Session, q Query, n int, want map[string]uint64) {
	t.Helper()
	for i := range n {
		u, err := s.Read(context.Background(), q)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if diff := cmp.Diff(want, u.CPU); diff != "" {
			t.Fatalf("read %d CPU (-want +got):\n%s", i, diff)
		}
	}
}

var wantCPU = map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "sbx-exp1": 0}

func TestSessionKeepsConnection(t *testing.T) {
	fx := getFixtures(t)
	t.Run("new runsc: three Reads, one connection", func(t *testing.T) {
		root := t.TempDir()
		f := startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
		s := newSession(t, Config{RootDirs: []string{root}})
		readN(t, s, busy1, 3, wantCPU)
		if acc, open := f.counts(); acc != 1 || open != 1 {
			t.Errorf("%d accepts, %d open, want 1 and 1", acc, open)
		}
		if n := len(f.seen()); n != 3 {
			t.Errorf("%d requests, want 3", n)
		}
		s.Close()
		waitOpen(t, f, 0) // Close closes the kept connection
		// A Read after Close dials and keeps nothing.
		readN(t, s, busy1, 1, wantCPU)
		waitOpen(t, f, 0)
		if acc, _ := f.counts(); acc != 2 {
			t.Errorf("%d accepts, want 2", acc)
		}
	})
	t.Run("old runsc: the refused form on its own connection, then one", func(t *testing.T) {
		root := t.TempDir()
		f := startFake(t, sockIn(root, busy1.SandboxID), oldRunsc(fx))
		s := newSession(t, Config{RootDirs: []string{root}})
		readN(t, s, busy1, 3, wantCPU)
		waitOpen(t, f, 1) // the fake sees the refused connection's close when its goroutine runs
		if acc, _ := f.counts(); acc != 2 {
			t.Errorf("%d accepts, want 2", acc)
		}
	})
	t.Run("KeepFor: closed after it, the next Read dials", func(t *testing.T) {
		root := t.TempDir()
		f := startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
		s := newSession(t, Config{RootDirs: []string{root}, KeepFor: 100 * time.Millisecond})
		readN(t, s, busy1, 2, wantCPU)
		waitOpen(t, f, 0)
		readN(t, s, busy1, 1, wantCPU)
		if acc, _ := f.counts(); acc != 2 {
			t.Errorf("%d accepts, want 2", acc)
		}
	})
	t.Run("another sandbox: the kept connection closed", func(t *testing.T) {
		root := t.TempDir()
		f1 := startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
		f2 := startFake(t, sockIn(root, "sbx-2"), newRunsc(fx))
		s := newSession(t, Config{RootDirs: []string{root}})
		readN(t, s, busy1, 1, wantCPU)
		readN(t, s, Query{SandboxID: "sbx-2", ContainerID: "busy1"}, 1, wantCPU)
		waitOpen(t, f1, 0)
		if _, open := f2.counts(); open != 1 {
			t.Errorf("%d open on the second sandbox, want 1", open)
		}
	})
}

// TestSessionSentryCloses: a sentry that closes its end after each reply,
// or closes the kept connection when the next request comes: each Read
// dials once and succeeds.
func TestSessionSentryCloses(t *testing.T) {
	fx := getFixtures(t)
	for _, tc := range []struct {
		name     string
		behave   func(call int, arg json.RawMessage, c net.Conn)
		requests int
	}{
		{"closes after each reply", func(_ int, _ json.RawMessage, c net.Conn) {
			c.Write(fx["head-shaped-containerid.json"])
			c.Close()
		}, 3},
		{"closes on the second request without answering", func(call int, _ json.RawMessage, c net.Conn) {
			if call > 0 {
				c.Close()
				return
			}
			c.Write(fx["head-shaped-containerid.json"])
		}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			f := startFakeCalls(t, sockIn(root, busy1.SandboxID), tc.behave)
			s := newSession(t, Config{RootDirs: []string{root}})
			for i := range 3 {
				if i > 0 {
					time.Sleep(20 * time.Millisecond) // let the close arrive, or not
				}
				before, _ := f.counts()
				readN(t, s, busy1, 1, wantCPU)
				if after, _ := f.counts(); after != before+1 {
					t.Fatalf("read %d: %d dials, want 1", i, after-before)
				}
			}
			// The second case: the first read dials; each later one
			// writes on the kept connection, finds it closed, dials.
			if n := len(f.seen()); n != tc.requests {
				t.Errorf("%d requests, want %d", n, tc.requests)
			}
		})
	}
}

// TestSessionUnaskedBytes: bytes the sentry sends between calls are never
// read as the next reply: the connection is closed and the Read dials.
func TestSessionUnaskedBytes(t *testing.T) {
	fx := getFixtures(t)
	stale := []byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"busy1","data":{}},"containerUsage":{"busy1":1}}}`)
	for _, tc := range []struct {
		name   string
		behave func(call int, arg json.RawMessage, c net.Conn)
	}{
		{"a second reply right behind the first", func(_ int, _ json.RawMessage, c net.Conn) {
			c.Write(append(append([]byte(nil), fx["head-shaped-containerid.json"]...), stale...))
		}},
		{"a reply sent later, unasked", func(_ int, _ json.RawMessage, c net.Conn) {
			c.Write(fx["head-shaped-containerid.json"])
			time.Sleep(30 * time.Millisecond)
			c.Write(stale)
		}},
		{"one byte of white space", func(_ int, _ json.RawMessage, c net.Conn) {
			c.Write(fx["head-shaped-containerid.json"])
			time.Sleep(30 * time.Millisecond)
			c.Write([]byte("\n"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			f := startFakeCalls(t, sockIn(root, busy1.SandboxID), tc.behave)
			s := newSession(t, Config{RootDirs: []string{root}})
			for i := range 3 {
				readN(t, s, busy1, 1, wantCPU) // never the stale reply's busy1: 1
				time.Sleep(100 * time.Millisecond)
				if acc, _ := f.counts(); acc != i+1 {
					t.Fatalf("after read %d: %d accepts, want %d", i, acc, i+1)
				}
			}
		})
	}
}

// TestSessionHostileSecondCall: a sentry that answers the first call on a
// connection and then hangs or floods: the Read fails within its bound as
// Client.Read would, the connection is closed, and the next Read dials
// and succeeds.
func TestSessionHostileSecondCall(t *testing.T) {
	fx := getFixtures(t)
	flood := func(c net.Conn) {
		c.Write([]byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"`))
		chunk := []byte(strings.Repeat("A", 64<<10))
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}
	for _, tc := range []struct {
		name string
		bad  func(c net.Conn)
		max  int
		err  error
	}{
		{"hang", func(c net.Conn) { io.Copy(io.Discard, c) }, 0, ErrDeadline},
		{"flood", flood, 4096, ErrTooLarge},
		{"garbage", func(c net.Conn) { c.Write([]byte("\x1b]0;owned\x07")) }, 0, ErrMalformed},
		{"another container's reply", func(c net.Conn) {
			c.Write([]byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"other-pod-c","data":{}},"containerUsage":{"other-pod-c":1}}}`))
		}, 0, ErrWrongContainer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			var once sync.Once
			f := startFakeCalls(t, sockIn(root, busy1.SandboxID), func(call int, _ json.RawMessage, c net.Conn) {
				bad := false
				if call == 1 {
					once.Do(func() { bad = true }) // the first connection's second call only
				}
				if bad {
					tc.bad(c)
					return
				}
				c.Write(fx["head-shaped-containerid.json"])
			})
			s := newSession(t, Config{RootDirs: []string{root}, MaxReplyBytes: tc.max})
			readN(t, s, busy1, 1, wantCPU)
			start := time.Now()
			_, err := s.Read(context.Background(), busy1)
			if took := time.Since(start); took > testTimeout+slack {
				t.Errorf("took %v, bound %v", took, testTimeout)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("second read: %v, want %v", err, tc.err)
			}
			waitOpen(t, f, 0) // closed, not kept
			readN(t, s, busy1, 2, wantCPU)
			if acc, open := f.counts(); acc != 2 || open != 1 {
				t.Errorf("%d accepts, %d open, want 2 and 1", acc, open)
			}
		})
	}
}

// TestSessionHungNeighbour: a hung sentry behind one Session costs a Read
// on another Session of the same Client nothing, and concurrent Reads on
// one Session each get an answer.
func TestSessionHungNeighbour(t *testing.T) {
	fx := getFixtures(t)
	root := t.TempDir()
	startFake(t, sockIn(root, "hung"), hang)
	f := startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
	c := newClient(t, Config{RootDirs: []string{root}, Timeout: 5 * time.Second})
	hung, healthy := c.Session(), c.Session()
	defer hung.Close()
	defer healthy.Close()
	hungDone := make(chan error, 1)
	go func() {
		_, err := hung.Read(context.Background(), Query{SandboxID: "hung", ContainerID: "hung"})
		hungDone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := healthy.Read(context.Background(), busy1)
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took > slack {
		t.Errorf("the healthy reads took %v beside a hung one", took)
	}
	select {
	case err := <-hungDone:
		t.Fatalf("the hung read returned first: %v", err)
	default:
	}
	waitOpen(t, f, 1) // one kept, the others closed
}

package sentryusage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeSentry is an in-process control server: it serves calls on a
// connection one after another as urpc's server does (one JSON value a
// request), checks that each is Method with one argument, records it and
// lets behave answer (call counts the calls on that connection, from 0).
// It counts the connections it accepted and those still open.
type fakeSentry struct {
	t      testing.TB
	ln     net.Listener
	behave func(call int, arg json.RawMessage, c net.Conn)

	mu       sync.Mutex
	requests []string
	accepts  int
	open     int
	done     chan struct{}
}

// startFake listens on addr (a path, or @name for an abstract socket).
func startFake(t testing.TB, addr string, behave func(arg json.RawMessage, c net.Conn)) *fakeSentry {
	t.Helper()
	return startFakeCalls(t, addr, func(_ int, arg json.RawMessage, c net.Conn) { behave(arg, c) })
}

// startFakeCalls is startFake with behave told which call of its
// connection it answers.
func startFakeCalls(t testing.TB, addr string, behave func(call int, arg json.RawMessage, c net.Conn)) *fakeSentry {
	t.Helper()
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSentry{t: t, ln: ln, behave: behave, done: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(f.done)
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.accepts++
			f.open++
			f.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					f.mu.Lock()
					f.open--
					f.mu.Unlock()
				}()
				defer c.Close()
				go func() { <-f.done; c.Close() }()
				dec := json.NewDecoder(c)
				for call := 0; ; call++ {
					var raw json.RawMessage
					if err := dec.Decode(&raw); err != nil {
						return
					}
					method, arg, err := splitRequest(raw)
					if err != nil || method != Method {
						t.Errorf("the client sent method %q: %v", method, err)
						return
					}
					f.mu.Lock()
					f.requests = append(f.requests, string(raw))
					f.mu.Unlock()
					f.behave(call, arg, c)
				}
			}()
		}
	}()
	return f
}

// counts returns the connections accepted so far and those still open.
func (f *fakeSentry) counts() (accepts, open int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accepts, f.open
}

func (f *fakeSentry) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// reply answers with b.
func reply(b []byte) func(json.RawMessage, net.Conn) {
	return func(_ json.RawMessage, c net.Conn) { c.Write(b) }
}

// hang never answers: it waits for the client (or the test's end) to close
// the connection.
func hang(_ json.RawMessage, c net.Conn) { io.Copy(io.Discard, c) }

// oldRunsc answers as release-20221219 does: a container id refused with
// its real error, null with the real reply.
func oldRunsc(fx map[string][]byte) func(json.RawMessage, net.Conn) {
	return func(arg json.RawMessage, c net.Conn) {
		if string(arg) == "null" {
			c.Write(fx["release-20221219-noarg.json"])
			return
		}
		c.Write(fx["release-20221219-refuses-id.json"])
	}
}

// newRunsc answers as release-20230731 and later: the id echoed, null
// refused (no container "").
func newRunsc(fx map[string][]byte) func(json.RawMessage, net.Conn) {
	return func(arg json.RawMessage, c net.Conn) {
		if string(arg) == `"busy1"` {
			c.Write(fx["head-shaped-containerid.json"])
			return
		}
		c.Write([]byte(`{"success":false,"err":"failed to get process count: container \"\" not found","result":null}`))
	}
}

const testTimeout = 300 * time.Millisecond

// slack is how late past its bound a Read may return on a loaded 2-core
// machine.
const slack = 1500 * time.Millisecond

func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sockIn returns root/runsc-<sid>.sock, the file layout.
func sockIn(root, sid string) string { return filepath.Join(root, "runsc-"+sid+".sock") }

var busy1 = Query{SandboxID: "sbx-exp1", ContainerID: "busy1"}

func TestReadLayoutsAndDialects(t *testing.T) {
	fx := getFixtures(t)
	wantOld := Usage{Dialect: DialectNoArg, CPU: map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "sbx-exp1": 0},
		MemoryBytes: u64(6066176), Memory: MemorySandboxTotal, Pids: u64(3), PidsSandboxWide: true}
	wantNew := Usage{Dialect: DialectContainerID, CPU: map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "sbx-exp1": 0},
		MemoryBytes: u64(3033088), Memory: MemorySplitOrOwn, Pids: u64(2)}
	noArg := `{"method":"containerManager.Event","arg":null}`
	withID := `{"method":"containerManager.Event","arg":"busy1"}`
	uniq := func(t *testing.T) string { return fmt.Sprintf("sbstest-%d-%d", os.Getpid(), time.Now().UnixNano()) }

	t.Run("old runsc on a socket file: the id refused once, then null", func(t *testing.T) {
		root := t.TempDir()
		f := startFake(t, sockIn(root, busy1.SandboxID), oldRunsc(fx))
		c := newClient(t, Config{RootDirs: []string{filepath.Join(t.TempDir(), "absent"), root}})
		for i := range 2 {
			got, err := c.Read(context.Background(), busy1)
			if err != nil {
				t.Fatal(err)
			}
			want := wantOld
			want.Socket = sockIn(root, busy1.SandboxID)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("read %d (-want +got):\n%s", i, diff)
			}
		}
		if diff := cmp.Diff([]string{withID, noArg, noArg}, f.seen()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
	t.Run("new runsc on a socket file: the id", func(t *testing.T) {
		root := t.TempDir()
		f := startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
		c := newClient(t, Config{RootDirs: []string{root}, Abstract: true})
		got, err := c.Read(context.Background(), busy1)
		if err != nil {
			t.Fatal(err)
		}
		want := wantNew
		want.Socket = sockIn(root, busy1.SandboxID)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{withID}, f.seen()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
	t.Run("Debian 20221219: abstract with a trailing NUL", func(t *testing.T) {
		q := Query{SandboxID: uniq(t), ContainerID: "busy1"}
		f := startFake(t, "@runsc-sandbox."+q.SandboxID+"\x00", oldRunsc(fx))
		c := newClient(t, Config{RootDirs: []string{t.TempDir()}, Abstract: true})
		got, err := c.Read(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if want := `@runsc-sandbox.` + q.SandboxID + `\x00`; got.Socket != want || got.Dialect != DialectNoArg {
			t.Errorf("socket %q dialect %v, want %q no-arg", got.Socket, got.Dialect, want)
		}
		if diff := cmp.Diff([]string{noArg}, f.seen()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
	t.Run("abstract without the NUL, a runsc of release-20230731 to 20230920: null refused, then the id", func(t *testing.T) {
		q := Query{SandboxID: uniq(t), ContainerID: "busy1"}
		f := startFake(t, "@runsc-sandbox."+q.SandboxID, newRunsc(fx))
		c := newClient(t, Config{Abstract: true})
		got, err := c.Read(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if got.Socket != "@runsc-sandbox."+q.SandboxID || got.Dialect != DialectContainerID {
			t.Errorf("socket %q dialect %v", got.Socket, got.Dialect)
		}
		if diff := cmp.Diff([]string{noArg, withID}, f.seen()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
	t.Run("a path longer than sun_path: through /proc/self/fd", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
		if err := os.Mkdir(root, 0o700); err != nil {
			t.Fatal(err)
		}
		// Listen through a short symlink: bind(2) has the same limit.
		short := filepath.Join(os.TempDir(), "sbs-"+time.Now().Format("150405.000000000"))
		if err := os.Symlink(root, short); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(short) })
		startFake(t, sockIn(short, busy1.SandboxID), newRunsc(fx))
		c := newClient(t, Config{RootDirs: []string{root}})
		got, err := c.Read(context.Background(), busy1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Socket) < unixPathMax || got.Dialect != DialectContainerID {
			t.Errorf("socket %q (%d bytes) dialect %v", got.Socket, len(got.Socket), got.Dialect)
		}
	})
}

func TestReadHostileSentry(t *testing.T) {
	fx := getFixtures(t)
	cases := []struct {
		name   string
		behave func(json.RawMessage, net.Conn)
		max    int
		err    error
		text   string
	}{
		{name: "hang: never answers", behave: hang, err: ErrDeadline, text: "read reply (bound 300ms)"},
		{name: "slow: a byte every 50ms", behave: func(_ json.RawMessage, c net.Conn) {
			for _, b := range fx["head-shaped-containerid.json"] {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}, err: ErrDeadline, text: "i/o timeout"},
		{name: "flood: a string that never ends", behave: func(_ json.RawMessage, c net.Conn) {
			c.Write([]byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"`))
			chunk := []byte(strings.Repeat("A", 64<<10))
			for {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}, max: 4096, err: ErrTooLarge, text: "more than 4096 bytes"},
		{name: "flood: a whole reply one byte past the cap", behave: reply(fx["head-shaped-containerid.json"]), max: len(fx["head-shaped-containerid.json"]) - 1, err: ErrTooLarge},
		{name: "garbage", behave: reply([]byte("\x1b]0;owned\x07\xff\xfe garbage")), err: ErrMalformed, text: `not JSON at byte 1 near "\x1b]0;owned\a\xff\xfe garb"`},
		{name: "closes without answering", behave: func(_ json.RawMessage, c net.Conn) { c.Close() }, err: ErrIO, text: "closed after 0 bytes"},
		{name: "half a reply, then closes", behave: func(_ json.RawMessage, c net.Conn) { c.Write(fx["head-shaped-containerid.json"][:40]); c.Close() }, err: ErrIO, text: "closed after 40 bytes"},
		{name: "another container's reply", behave: reply([]byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"other-pod-c","data":{}},"containerUsage":{"other-pod-c":1}}}`)), err: ErrWrongContainer, text: `event.id "other-pod-c"`},
		{name: "an error whose text is a terminal escape", behave: reply([]byte(`{"success":false,"err":"\u001b[2Jboom","result":null}`)), err: ErrRemote, text: `"\x1b[2Jboom"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			startFake(t, sockIn(root, busy1.SandboxID), tc.behave)
			c := newClient(t, Config{RootDirs: []string{root}, MaxReplyBytes: tc.max})
			start := time.Now()
			_, err := c.Read(context.Background(), busy1)
			took := time.Since(start)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %v, want %v containing %q", err, tc.err, tc.text)
			}
			if sock := sockIn(root, busy1.SandboxID); !strings.Contains(err.Error(), "socket "+sock+`, container "busy1"`) {
				t.Errorf("error %q does not name the socket and the container", err)
			}
			if took > testTimeout+slack {
				t.Errorf("took %v, bound %v", took, testTimeout)
			}
			t.Logf("%v in %v", err, took.Round(time.Millisecond))
		})
	}
}

// TestReadHungNeighbour: a sentry that hangs costs a Read of another
// sandbox on the same Client nothing.
func TestReadHungNeighbour(t *testing.T) {
	fx := getFixtures(t)
	root := t.TempDir()
	startFake(t, sockIn(root, "hung"), hang)
	startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
	c := newClient(t, Config{RootDirs: []string{root}, Timeout: 5 * time.Second})
	hungDone := make(chan error, 1)
	go func() {
		_, err := c.Read(context.Background(), Query{SandboxID: "hung", ContainerID: "hung"})
		hungDone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if _, err := c.Read(context.Background(), busy1); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > slack {
		t.Errorf("the healthy read took %v beside a hung one", took)
	}
	select {
	case err := <-hungDone:
		t.Fatalf("the hung read returned first: %v", err)
	default:
	}
}

func TestReadContextCancel(t *testing.T) {
	root := t.TempDir()
	startFake(t, sockIn(root, busy1.SandboxID), hang)
	c := newClient(t, Config{RootDirs: []string{root}, Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Read(ctx, busy1)
	if !errors.Is(err, ErrDeadline) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want ErrDeadline and context.Canceled", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond+slack {
		t.Errorf("took %v after a cancel at 100ms", took)
	}
}

func TestReadNoSocket(t *testing.T) {
	root := t.TempDir()
	// A socket file left by a dead sandbox: ECONNREFUSED.
	ln, err := net.Listen("unix", sockIn(root, "dead"))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	c := newClient(t, Config{RootDirs: []string{root}, Abstract: true})
	for _, sid := range []string{"dead", "never"} {
		_, err := c.Read(context.Background(), Query{SandboxID: sid, ContainerID: sid})
		if !errors.Is(err, ErrNoSocket) || !strings.Contains(err.Error(), sockIn(root, sid)) || !strings.Contains(err.Error(), "@runsc-sandbox."+sid+`\x00`) {
			t.Errorf("sandbox %s: %v, want ErrNoSocket naming every place tried", sid, err)
		}
	}
}

func TestReadBadIDs(t *testing.T) {
	c := newClient(t, Config{RootDirs: []string{t.TempDir()}})
	for _, q := range []Query{
		{SandboxID: "../../run/other", ContainerID: "a"},
		{SandboxID: "a", ContainerID: ""},
		{SandboxID: "a\x00b", ContainerID: "a"},
		{SandboxID: "..", ContainerID: "a"},
		{SandboxID: strings.Repeat("a", MaxIDBytes+1), ContainerID: "a"},
	} {
		if _, err := c.Read(context.Background(), q); !errors.Is(err, ErrBadID) {
			t.Errorf("%+v: %v, want ErrBadID", q, err)
		}
	}
}

func TestNewRejects(t *testing.T) {
	for _, cfg := range []Config{{}, {RootDirs: []string{""}}, {Abstract: true, Timeout: -1}, {Abstract: true, MaxReplyBytes: -1}, {Abstract: true, KeepFor: -1}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

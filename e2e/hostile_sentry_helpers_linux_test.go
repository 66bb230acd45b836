package e2e

// Helpers of the hostile-sentry test: runsc state files written into a
// runsc root from the shape of a real one (testdata/runsc), and fake
// control servers on runsc's socket-file layout that check every request
// statsd sends.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// eventMethod is the only method statsd may send a sentry.
const eventMethod = "containerManager.Event"

// fakeRunscContainer is one container of a fake runsc sandbox: its id and
// its CRI name.
type fakeRunscContainer struct{ id, name string }

// writeRunscSandbox writes into root the state files of a sandbox sid
// (its pause container, named "pause", then the containers in order), as
// runsc 20221219 writes them (<cid>_sandbox:<sid>.state), from
// testdata/runsc: the sandbox's pid is pid (a process in the sandbox's
// cgroup, as the sentry is) and its cgroup cgroupPath.
func writeRunscSandbox(t *testing.T, root, sid string, pid int, cgroupPath string, cs ...fakeRunscContainer) {
	t.Helper()
	created := time.Now().Add(-time.Minute)
	write := func(fixture, cid, name, typ string) {
		b, err := os.ReadFile(filepath.Join("testdata", "runsc", fixture))
		if err != nil {
			t.Fatal(err)
		}
		var st map[string]any
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatalf("testdata/runsc/%s: %v", fixture, err)
		}
		obj := func(m map[string]any, key string) map[string]any {
			v, ok := m[key].(map[string]any)
			if !ok {
				t.Fatalf("testdata/runsc/%s: no object %q", fixture, key)
			}
			return v
		}
		st["id"] = cid
		st["createdAt"] = created.Format(time.RFC3339Nano)
		created = created.Add(time.Millisecond) // the pause container first, then in order
		st["goferPid"] = 0
		ann := obj(obj(st, "spec"), "annotations")
		ann["io.kubernetes.cri.container-name"] = name
		ann["io.kubernetes.cri.container-type"] = typ
		ann["io.kubernetes.cri.sandbox-id"] = sid
		sb := obj(st, "sandbox")
		sb["id"], sb["pid"] = sid, pid
		obj(obj(sb, "cgroup"), "cgroupv1")["name"] = cgroupPath
		obj(obj(st, "saver"), "id")["sandboxId"] = sid
		obj(obj(st, "saver"), "id")["containerId"] = cid
		out, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, cid+"_sandbox:"+sid+".state"), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sandbox.state", sid, "pause", "sandbox")
	for _, c := range cs {
		write("container.state", c.id, c.name, "container")
	}
}

// fakeSentry is a control server on runsc's socket-file layout
// (<root>/runsc-<sid>.sock). It reads requests as urpc's server does (one
// JSON value after another on a connection), fails the test on any request
// that is not containerManager.Event with a null argument or the sandbox's
// id, and lets answer reply to each.
type fakeSentry struct {
	sid     string
	answer  func(c net.Conn)
	calls   atomic.Int64
	written atomic.Int64 // bytes written to statsd (the flood's)
}

// startFakeSentry serves sid's control socket in root until the test ends.
func startFakeSentry(t *testing.T, root, sid string, answer func(f *fakeSentry, c net.Conn)) *fakeSentry {
	t.Helper()
	f := &fakeSentry{sid: sid}
	f.answer = func(c net.Conn) { answer(f, c) }
	ln, err := net.Listen("unix", filepath.Join(root, "runsc-"+sid+".sock"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(done); ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					select {
					case <-done:
						c.Close()
					case <-stop:
					}
				}()
				f.serve(t, c)
			})
		}
	})
	return f
}

// serve checks each request on c and answers it.
func (f *fakeSentry) serve(t *testing.T, c net.Conn) {
	dec := json.NewDecoder(c)
	for {
		var req map[string]json.RawMessage
		if err := dec.Decode(&req); err != nil {
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			if errors.As(err, &se) || errors.As(err, &te) {
				t.Errorf("sentry %s: statsd sent something that is not a request: %v", f.sid, err)
			}
			return // the client closed (or the test ended)
		}
		var method string
		_ = json.Unmarshal(req["method"], &method)
		arg := string(req["arg"])
		if method != eventMethod || len(req) != 2 || (arg != "null" && arg != fmt.Sprintf("%q", f.sid)) {
			t.Errorf("sentry %s: statsd sent method %q arg %s (%d keys): only %s with null or the sandbox id may be sent", f.sid, method, arg, len(req), eventMethod)
			return
		}
		f.calls.Add(1)
		f.answer(c)
	}
}

// sentryReply is a successful containerManager.Event reply in the id
// dialect (runsc >= 20230731): the event about container id, and the CPU
// (ns) of every container.
func sentryReply(id string, usage map[string]uint64) []byte {
	b, _ := json.Marshal(map[string]any{"success": true, "err": "", "result": map[string]any{
		"event": map[string]any{"type": "stats", "id": id, "data": map[string]any{
			"cpu": map[string]any{"usage": map[string]any{}}, "pids": map[string]any{"current": 2}}},
		"containerUsage": usage}})
	return b
}

// Fake sentries' answers.
var (
	// sentryHangs accepts the request and never answers (serve goes on
	// reading, checking anything more statsd sends, until statsd closes).
	sentryHangs = func(*fakeSentry, net.Conn) {}
	// sentryFloods answers the start of a reply, then bytes without end.
	sentryFloods = func(f *fakeSentry, c net.Conn) {
		n, _ := c.Write([]byte(`{"success":true,"err":"`))
		f.written.Add(int64(n))
		chunk := make([]byte, 32<<10)
		for i := range chunk {
			chunk[i] = 'A'
		}
		for {
			n, err := c.Write(chunk)
			f.written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}
	// sentrySlow answers a valid start of a reply a byte every 50 ms,
	// without end.
	sentrySlow = func(f *fakeSentry, c net.Conn) {
		for i := 0; ; i++ {
			b := []byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"`)
			n, err := c.Write([]byte{b[min(i, len(b)-1)]})
			f.written.Add(int64(n))
			if err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// sentryGarbage answers bytes that are not JSON, a terminal escape
	// sequence first (set a window title, clear the screen).
	sentryGarbage = func(_ *fakeSentry, c net.Conn) {
		_, _ = c.Write([]byte("\x1b]0;owned by the sentry\x07\x1b[2J\x1b[31mGARBAGE " + string(make([]byte, 4096))))
	}
)

// sentryLies answers with another sandbox's container: the event about
// other, the CPU of other's containers.
func sentryLies(other string, usage map[string]uint64) func(*fakeSentry, net.Conn) {
	return func(_ *fakeSentry, c net.Conn) { _, _ = c.Write(sentryReply(other, usage)) }
}

// sentryLiesAboutKeys answers about the sandbox asked for, but with the CPU
// of another sandbox's containers (keys usage names).
func sentryLiesAboutKeys(usage map[string]uint64) func(*fakeSentry, net.Conn) {
	return func(f *fakeSentry, c net.Conn) { _, _ = c.Write(sentryReply(f.sid, usage)) }
}

// sentryAnswers answers as a healthy runsc >= 20230731: the event about
// the sandbox asked for, the CPU of each container usage gives (ns, at the
// time of the call).
func sentryAnswers(usage func() map[string]uint64) func(*fakeSentry, net.Conn) {
	return func(f *fakeSentry, c net.Conn) { _, _ = c.Write(sentryReply(f.sid, usage())) }
}

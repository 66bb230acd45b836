package sweep

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// kept returns the connection p keeps for socket, or nil.
func kept(t *testing.T, p *Pool, socket string) *daemonConn {
	t.Helper()
	abs, err := filepath.Abs(socket)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[abs]
}

func pollOne(t *testing.T, p *Pool, socket string) DaemonResult {
	t.Helper()
	return p.PollAll(context.Background(), []string{socket})[0]
}

// TestPoolKeepsConnection: the second sweep polls a daemon on the
// connection the first made.
func TestPoolKeepsConnection(t *testing.T) {
	d := statsdfake.Start(t, filepath.Join(t.TempDir(), "a.sock"))
	d.Set(sample("a", 1, 1))
	p := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	if r := pollOne(t, p, d.Socket); r.Status != StatusOK {
		t.Fatalf("first poll: %s %v", r.Status, r.Err)
	}
	first := kept(t, p, d.Socket)
	if r := pollOne(t, p, d.Socket); r.Status != StatusOK {
		t.Fatalf("second poll: %s %v", r.Status, r.Err)
	}
	if got := kept(t, p, d.Socket); got == nil || got != first {
		t.Errorf("second poll on connection %p, want the first's %p", got, first)
	}
	if d.Calls() != 2 {
		t.Errorf("daemon answered %d calls, want 2", d.Calls())
	}
}

// TestPoolReplacedSocket: a daemon restarted on the same path (a new
// socket file) is polled on a new connection, and the old one is closed,
// never asked again (it could still reach the old process).
func TestPoolReplacedSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "a.sock")
	old := statsdfake.Start(t, socket)
	old.Set(sample("old", 1, 1))
	p := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	if r := pollOne(t, p, socket); r.Status != StatusOK {
		t.Fatalf("first poll: %s %v", r.Status, r.Err)
	}
	first := kept(t, p, socket)
	old.Kill()
	replaced := statsdfake.Start(t, socket)
	replaced.Set(sample("new", 1, 1))
	if fi, err := os.Lstat(socket); err == nil {
		if id, _, _ := fileOwner(fi); id == first.id.fileID {
			t.Logf("the new socket has the old one's inode %d (reused): told apart by its time", id.ino)
		}
	}
	r := pollOne(t, p, socket)
	if r.Status != StatusOK || r.Samples[0].GetActorUid() != "new" {
		t.Fatalf("poll after the restart: %s %v %v, want the new daemon's sample", r.Status, r.Err, r.Samples)
	}
	if kept(t, p, socket) == first {
		t.Error("the replaced socket is polled on the old connection")
	}
	if s := first.cc.GetState(); s != connectivity.Shutdown {
		t.Errorf("old connection %s, want closed", s)
	}
}

// TestPoolVanishedFailedAndGone: a connection whose socket vanished, one a
// poll failed on, and one whose socket a sweep was not given are closed;
// the failed daemon is dialed afresh at the next sweep.
func TestPoolVanishedFailedAndGone(t *testing.T) {
	dir := t.TempDir()
	vanishing := statsdfake.Start(t, filepath.Join(dir, "a-vanishing.sock"))
	failing := statsdfake.Start(t, filepath.Join(dir, "b-failing.sock"))
	gone := statsdfake.Start(t, filepath.Join(dir, "c-gone.sock"))
	for _, d := range []*statsdfake.Daemon{vanishing, failing, gone} {
		d.Set(sample(filepath.Base(d.Socket), 1, 1))
	}
	all := []string{vanishing.Socket, failing.Socket, gone.Socket}
	p := Config{Concurrency: 3, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	for _, r := range p.PollAll(context.Background(), all) {
		if r.Status != StatusOK {
			t.Fatalf("%s: %s %v", r.Socket, r.Status, r.Err)
		}
	}
	conns := map[string]*daemonConn{}
	for _, s := range all {
		conns[s] = kept(t, p, s)
	}
	vanishing.Kill()
	failing.SetError(status.Error(codes.Internal, "malformed memory.stat"))
	results := p.PollAll(context.Background(), all[:2]) // gone: not found by this sweep
	if r := results[0]; r.Status != StatusVanished {
		t.Errorf("vanished daemon: %s %s %v", r.Status, r.Code, r.Err)
	}
	if r := results[1]; r.Status != StatusError || r.Code != codes.Internal {
		t.Errorf("failing daemon: %s %s %v", r.Status, r.Code, r.Err)
	}
	for _, s := range all {
		if dc := kept(t, p, s); dc != nil {
			t.Errorf("%s: connection still kept", filepath.Base(s))
		}
		if st := conns[s].cc.GetState(); st != connectivity.Shutdown {
			t.Errorf("%s: connection %s, want closed", filepath.Base(s), st)
		}
	}
	failing.Set(sample("b", 1, 1))
	if r := pollOne(t, p, failing.Socket); r.Status != StatusOK || kept(t, p, failing.Socket) == nil {
		t.Errorf("the failed daemon, answering again: %s %v, kept %v", r.Status, r.Err, kept(t, p, failing.Socket) != nil)
	}
}

// TestPoolBrokenConnection: a daemon drops the kept connection just
// before a poll (it restarted on the same socket a moment ago): the poll
// still answers, on a fresh connection, as it would have without a Pool.
func TestPoolBrokenConnection(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "a.sock")
	inner, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ln := &acceptRecorder{Listener: inner}
	d := statsdfake.Serve(t, ln, socket)
	d.Set(sample("a", 1, 1))
	p := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	for i := range 20 {
		if r := pollOne(t, p, socket); r.Status != StatusOK {
			t.Fatalf("poll %d: %s %s %v", i, r.Status, r.Code, r.Err)
		}
		ln.closeAll()
	}
}

// acceptRecorder is a listener that keeps the connections it accepted.
type acceptRecorder struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *acceptRecorder) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *acceptRecorder) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// TestPoolReconnectChecksPeer: a kept connection whose transport broke
// reconnects at the next poll, and the reconnect checks the server's uid
// again: here no uid is allowed any more, so the poll is refused
// (PermissionDenied) and the connection closed.
func TestPoolReconnectChecksPeer(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "a.sock")
	inner, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ln := &acceptRecorder{Listener: inner}
	statsdfake.Serve(t, ln, socket).Set(sample("a", 1, 1))
	p := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	if r := pollOne(t, p, socket); r.Status != StatusOK {
		t.Fatalf("first poll: %s %v", r.Status, r.Err)
	}
	dc := kept(t, p, socket)
	ln.closeAll() // the daemon drops the connection; its socket stays
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for s := dc.cc.GetState(); s == connectivity.Ready; s = dc.cc.GetState() {
		if !dc.cc.WaitForStateChange(ctx, s) {
			t.Fatal("the kept connection did not notice the daemon dropped it")
		}
	}
	clear(p.p.allow) // the server's uid (this process's) is no longer allowed
	r := pollOne(t, p, socket)
	if r.Status != StatusError || r.Code != codes.PermissionDenied || !r.PeerRefused || len(r.Samples) != 0 {
		t.Fatalf("poll on the reconnect: %s %s peer refused %v, %d samples (%v); want refused, PermissionDenied",
			r.Status, r.Code, r.PeerRefused, len(r.Samples), r.Err)
	}
	if kept(t, p, socket) != nil || dc.cc.GetState() != connectivity.Shutdown {
		t.Error("the refused connection is still kept")
	}
	if _, err := os.Lstat(socket); err != nil {
		t.Fatalf("the socket is gone: %v", err)
	}
}

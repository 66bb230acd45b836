// Package kataagentfake is an in-process fake of the Kata guest agent for tests
// and benchmarks: a real ttrpc server answering grpc.AgentService/
// StatsContainer and grpc.Health/Version from a script, behind a real Unix
// socket that first performs the hybrid-vsock handshake ("CONNECT <port>\n"
// answered "OK <host port>\n") as Cloud Hypervisor and Firecracker do (NewOn
// serves it on another listener: a real AF_VSOCK one in the VM lane's guest,
// without the handshake). Faults (a garbage or closed handshake, an agent
// that never answers, a kill and restart) are options and methods.
//
// Replies are built with V1 and V2 from a Container: memory, CPU, and the
// signals (limit, throttling, pids, network_stats, per-device block IO) laid
// out as the Rust agent sends them for each guest cgroup version. Calls
// counts every request read from the wire by method, served or not.
//
// Hostile (hostile.go) is the agent a guest controls: raw ttrpc frames on
// streams no call opened, a frame header announcing 100 MiB and then
// silence, no answer at all, or an error status for every call.
package kataagentfake

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// Handshake is how the fake answers the hybrid-vsock CONNECT line.
type Handshake int

const (
	// HandshakeOK answers "OK <host port>\n" and then serves ttrpc.
	HandshakeOK Handshake = iota
	// HandshakeGarbage answers a line that is not "OK <n>".
	HandshakeGarbage
	// HandshakeClose closes the connection after reading CONNECT, as
	// Firecracker does when nothing listens on the guest port.
	HandshakeClose
	// HandshakeHang reads CONNECT and never answers.
	HandshakeHang
	// HandshakeSilent answers "OK" and then never reads or answers a ttrpc
	// request: an agent that accepts and hangs.
	HandshakeSilent
	// HandshakeNone expects no handshake: plain ttrpc on the Unix socket
	// (what a vsock connection looks like once dialled).
	HandshakeNone
)

// DefaultPort is the agent's guest vsock port.
const DefaultPort = 1024

// hostPortBase is where Cloud Hypervisor allocates host-side ports (1<<30).
const hostPortBase = 1 << 30

// Option scripts the fake.
type Option func(*Agent)

// WithVersion sets the agent_version Health.Version answers (default
// "3.9.0").
func WithVersion(v string) Option { return func(a *Agent) { a.version = v } }

// WithVersionError makes Health.Version fail with err (a policy that denies
// it, an agent without it).
func WithVersionError(err error) Option { return func(a *Agent) { a.versionErr = err } }

// WithContainer scripts the StatsContainer reply for id.
func WithContainer(id string, reply *katagrpc.StatsContainerResponse) Option {
	return func(a *Agent) { a.replies[id] = reply }
}

// WithContainerError makes StatsContainer for id fail with err (use a
// status error for a specific code).
func WithContainerError(id string, err error) Option {
	return func(a *Agent) { a.errs[id] = err }
}

// WithHandshake sets how the fake answers CONNECT.
func WithHandshake(h Handshake) Option { return func(a *Agent) { a.handshake = h } }

// Agent is a running fake agent.
type Agent struct {
	tb     testing.TB
	path   string // the Unix socket; "" for NewOn
	listen ListenFunc

	mu         sync.Mutex
	version    string
	versionErr error
	replies    map[string]*katagrpc.StatsContainerResponse
	errs       map[string]error
	handshake  Handshake
	port       uint32
	nextPort   int

	ln       net.Listener
	srv      *ttrpc.Server
	handoff  chan net.Conn
	raw      map[net.Conn]bool // every accepted connection still open
	stopped  chan struct{}
	wg       sync.WaitGroup
	dials    int // connections accepted on the socket, handshake or not
	accepted int // connections that completed the handshake
	closedN  int // handed-over connections that have closed
	stats    int // StatsContainer calls received
	inStats  int // StatsContainer calls running now
	maxIn    int // most StatsContainer calls running at once
	delay    time.Duration
	hang     bool
	versions int            // Version calls answered
	calls    map[string]int // every request received, by method path (calls.go)
	gone     chan struct{}  // signalled on every disconnect
}

// New starts a fake agent on a Unix socket in dir; t.Cleanup stops it.
func New(tb testing.TB, dir string, opts ...Option) *Agent {
	tb.Helper()
	path := filepath.Join(dir, "agent.hvsock")
	return newAgent(tb, path, func() (net.Listener, error) {
		_ = os.Remove(path)
		return net.Listen("unix", path)
	}, opts)
}

// ListenFunc makes the listener a fake agent serves: once when it starts and
// once more at each Restart.
type ListenFunc func() (net.Listener, error)

// NewOn starts a fake agent on the listeners listen makes instead of a Unix
// socket (inside the VM lane's guest: a real AF_VSOCK listener on the
// loopback); t.Cleanup stops it. Nothing is created or removed on disk, so
// Address, SocketPath and DialBare, which name the Unix socket, are not for
// it. A vsock stream has no CONNECT line: pass WithHandshake(HandshakeNone).
// Stop closes the listener; Restart calls listen again.
func NewOn(tb testing.TB, listen ListenFunc, opts ...Option) *Agent {
	tb.Helper()
	return newAgent(tb, "", listen, opts)
}

func newAgent(tb testing.TB, path string, listen ListenFunc, opts []Option) *Agent {
	tb.Helper()
	a := &Agent{
		tb:       tb,
		path:     path,
		listen:   listen,
		version:  "3.9.0",
		replies:  make(map[string]*katagrpc.StatsContainerResponse),
		errs:     make(map[string]error),
		port:     DefaultPort,
		nextPort: hostPortBase,
		calls:    make(map[string]int),
		gone:     make(chan struct{}, 1024),
	}
	for _, o := range opts {
		o(a)
	}
	a.start()
	tb.Cleanup(a.Stop)
	return a
}

// Address is the agent address for a SandboxRef: hvsock://<socket>:<port>.
func (a *Agent) Address() string {
	if a.path == "" {
		a.tb.Fatalf("kataagentfake: an agent served with NewOn has no hybrid vsock address")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("hvsock://%s:%d", a.path, a.port)
}

// SocketPath is the Unix socket the fake listens on.
func (a *Agent) SocketPath() string { return a.path }

// SetContainer replaces the scripted reply for id (and clears its error).
func (a *Agent) SetContainer(id string, reply *katagrpc.StatsContainerResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.replies[id] = reply
	delete(a.errs, id)
}

// SetContainerError makes StatsContainer for id fail with err.
func (a *Agent) SetContainerError(id string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs[id] = err
}

// SetStatsDelay makes every StatsContainer answer after d (a slow agent).
func (a *Agent) SetStatsDelay(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.delay = d
}

// SetStatsHang makes StatsContainer never answer (until Stop), ignoring the
// caller's deadline: an agent stuck in a cgroup read.
func (a *Agent) SetStatsHang(hang bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hang = hang
}

// MaxConcurrentStats is the most StatsContainer calls that ran at once.
func (a *Agent) MaxConcurrentStats() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxIn
}

// Stop kills the agent: the listener and every connection close and the
// socket file is removed. It is safe to call more than once.
func (a *Agent) Stop() {
	a.mu.Lock()
	ln, srv, stopped, raw := a.ln, a.srv, a.stopped, a.raw
	a.ln, a.srv, a.stopped = nil, nil, nil
	conns := make([]net.Conn, 0, len(raw))
	for c := range raw {
		conns = append(conns, c)
	}
	a.mu.Unlock()
	if ln == nil {
		return
	}
	close(stopped)
	ln.Close()
	srv.Close()
	for _, c := range conns {
		c.Close()
	}
	a.wg.Wait()
	if a.path != "" {
		_ = os.Remove(a.path)
	}
}

// Restart starts a stopped agent again at the same socket (NewOn: on a new
// listener from its ListenFunc) with the same script (the guest's counters
// are whatever the script says now).
func (a *Agent) Restart() {
	a.tb.Helper()
	a.Stop()
	a.start()
}

// Counts reports the connections that completed the handshake, the
// handshaken connections that have since closed, and the StatsContainer and
// Version calls answered.
func (a *Agent) Counts() (accepted, closed, stats, versions int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.accepted, a.closedN, a.stats, a.versions
}

// Dials is the number of connections accepted on the socket, whether or not
// their handshake succeeded.
func (a *Agent) Dials() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dials
}

// Disconnected receives once per handshaken connection that closes.
func (a *Agent) Disconnected() <-chan struct{} { return a.gone }

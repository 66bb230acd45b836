// Package kataagentfake is an in-process fake of the Kata guest agent for tests
// and benchmarks: a real ttrpc server answering grpc.AgentService/
// StatsContainer and grpc.Health/Version from a script, behind a real Unix
// socket that first performs the hybrid-vsock handshake ("CONNECT <port>\n"
// answered "OK <host port>\n") as Cloud Hypervisor and Firecracker do. Faults
// (a garbage or closed handshake, an agent that never answers, a kill and
// restart) are options and methods.
//
// Replies are built with V1 and V2 from a Container: memory, CPU, and the
// signals (limit, throttling, pids, network_stats, per-device block IO) laid
// out as the Rust agent sends them for each guest cgroup version. Calls
// counts every request read from the wire by method, served or not.
package kataagentfake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// WithPort sets the guest port the address names and the fake expects.
func WithPort(p uint32) Option { return func(a *Agent) { a.port = p } }

// Agent is a running fake agent.
type Agent struct {
	tb   testing.TB
	path string

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
	a := &Agent{
		tb:       tb,
		path:     filepath.Join(dir, "agent.hvsock"),
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

// Start is New for callers that need only the address and a stop function.
func Start(tb testing.TB, dir string, opts ...Option) (address string, stop func()) {
	tb.Helper()
	a := New(tb, dir, opts...)
	return a.Address(), a.Stop
}

// Address is the agent address for a SandboxRef: hvsock://<socket>:<port>.
func (a *Agent) Address() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("hvsock://%s:%d", a.path, a.port)
}

// SocketPath is the Unix socket the fake listens on.
func (a *Agent) SocketPath() string { return a.path }

func (a *Agent) start() {
	a.tb.Helper()
	_ = os.Remove(a.path)
	ln, err := net.Listen("unix", a.path)
	if err != nil {
		a.tb.Fatalf("kataagentfake: listen %s: %v", a.path, err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		a.tb.Fatalf("kataagentfake: %v", err)
	}
	srv.RegisterService("grpc.AgentService", &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"StatsContainer": a.statsContainer,
	}})
	srv.RegisterService("grpc.Health", &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"Version": a.versionCall,
		"Check": func(_ context.Context, unmarshal func(any) error) (any, error) {
			var req katagrpc.CheckRequest
			if err := unmarshal(&req); err != nil {
				return nil, err
			}
			return &katagrpc.HealthCheckResponse{Status: katagrpc.HealthCheckResponse_SERVING}, nil
		},
	}})
	handoff := make(chan net.Conn)
	stopped := make(chan struct{})
	a.mu.Lock()
	a.ln, a.srv, a.handoff, a.stopped = ln, srv, handoff, stopped
	a.raw = make(map[net.Conn]bool)
	a.mu.Unlock()

	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.acceptLoop(ln, handoff, stopped)
	}()
	go func() {
		defer a.wg.Done()
		_ = srv.Serve(context.Background(), &chanListener{ch: handoff, done: stopped, addr: ln.Addr()})
	}()
}

func (a *Agent) acceptLoop(ln net.Listener, handoff chan net.Conn, stopped chan struct{}) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		a.mu.Lock()
		a.raw[conn] = true
		a.dials++
		a.mu.Unlock()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.serveConn(conn, handoff, stopped)
		}()
	}
}

// serveConn performs the scripted handshake and hands the connection to the
// ttrpc server.
func (a *Agent) serveConn(conn net.Conn, handoff chan net.Conn, stopped chan struct{}) {
	a.mu.Lock()
	mode, port := a.handshake, a.port
	a.mu.Unlock()
	closeRaw := func() {
		conn.Close()
		a.mu.Lock()
		delete(a.raw, conn)
		a.mu.Unlock()
	}
	if mode != HandshakeNone {
		line, err := readLine(conn)
		if err != nil {
			closeRaw()
			return
		}
		want := fmt.Sprintf("CONNECT %d\n", port)
		if line != want {
			fmt.Fprintf(conn, "ERR want %q\n", want)
			closeRaw()
			return
		}
		switch mode {
		case HandshakeGarbage:
			fmt.Fprintf(conn, "HTTP/1.1 400 Bad Request\r\n\r\n")
			closeRaw()
			return
		case HandshakeClose:
			closeRaw()
			return
		case HandshakeHang:
			<-stopped
			closeRaw()
			return
		}
		a.mu.Lock()
		hostPort := a.nextPort
		a.nextPort++
		a.mu.Unlock()
		if _, err := fmt.Fprintf(conn, "OK %d\n", hostPort); err != nil {
			closeRaw()
			return
		}
		if mode == HandshakeSilent {
			a.mu.Lock()
			a.accepted++
			a.mu.Unlock()
			<-stopped
			closeRaw()
			return
		}
	}
	a.mu.Lock()
	a.accepted++
	a.mu.Unlock()
	tracked := &trackedConn{Conn: conn, requests: &requestCounter{onRequest: a.countRequest}, onClose: func() {
		a.mu.Lock()
		delete(a.raw, conn)
		a.closedN++
		a.mu.Unlock()
		select {
		case a.gone <- struct{}{}:
		default:
		}
	}}
	select {
	case handoff <- tracked:
	case <-stopped:
		tracked.Close()
	}
}

// readLine reads one '\n'-terminated line byte by byte (nothing after it is
// consumed), at most 64 bytes.
func readLine(conn net.Conn) (string, error) {
	var sb strings.Builder
	var b [1]byte
	for sb.Len() < 64 {
		if _, err := conn.Read(b[:]); err != nil {
			return sb.String(), err
		}
		sb.WriteByte(b[0])
		if b[0] == '\n' {
			return sb.String(), nil
		}
	}
	return sb.String(), errors.New("line too long")
}

func (a *Agent) statsContainer(_ context.Context, unmarshal func(any) error) (any, error) {
	var req katagrpc.StatsContainerRequest
	if err := unmarshal(&req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.stats++
	a.inStats++
	a.maxIn = max(a.maxIn, a.inStats)
	delay, hang, stopped := a.delay, a.hang, a.stopped
	a.mu.Unlock()
	if hang {
		// Never answer, whatever the caller's deadline, until killed.
		<-stopped
	} else if delay > 0 {
		time.Sleep(delay)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inStats--
	if err, ok := a.errs[req.GetContainerId()]; ok {
		return nil, err
	}
	r, ok := a.replies[req.GetContainerId()]
	if !ok {
		// What the Rust agent answers for an id it does not know.
		return nil, status.Error(codes.InvalidArgument, "invalid container id")
	}
	return r, nil
}

func (a *Agent) versionCall(_ context.Context, unmarshal func(any) error) (any, error) {
	var req katagrpc.CheckRequest
	if err := unmarshal(&req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.versions++
	if a.versionErr != nil {
		return nil, a.versionErr
	}
	return &katagrpc.VersionCheckResponse{GrpcVersion: "0.0.1", AgentVersion: a.version}, nil
}

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

// SetHandshake changes how later connections are answered.
func (a *Agent) SetHandshake(h Handshake) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handshake = h
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
	_ = os.Remove(a.path)
}

// Restart starts a stopped agent again at the same socket with the same
// script (the guest's counters are whatever the script says now).
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

// trackedConn reports its Close once and counts the requests read from it.
type trackedConn struct {
	net.Conn
	once     sync.Once
	onClose  func()
	requests *requestCounter // fed only by the ttrpc server's reader
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.requests.feed(p[:n])
	return n, err
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.onClose)
	return err
}

// chanListener is a net.Listener fed with already-handshaken connections.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	addr net.Addr
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

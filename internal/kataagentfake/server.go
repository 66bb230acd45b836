// This file is the fake's server side: the listener, the hybrid-vsock
// handshake on each connection, the hand-over to a real ttrpc server, and
// the two methods it answers.

package kataagentfake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

func (a *Agent) start() {
	a.tb.Helper()
	ln, err := a.listen()
	if err != nil {
		a.tb.Fatalf("kataagentfake: %v", err) // net.Listen's error names the socket
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

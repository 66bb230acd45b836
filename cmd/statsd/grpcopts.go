package main

// This file is the gRPC server's resource limits, the same on both sockets:
// requests are tiny, pollers few, and nothing a client sends may make
// statsd hold more than a bounded amount per connection.

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits of one gRPC connection. A request is an actor uid or a
// SandboxRef (25 container ids, a few paths): well under 64 KiB. With
// fixed 64 KiB stream windows (no BDP growth) and 16 streams, a connection
// buffers at most about 1 MiB of what a client sends.
const (
	maxConcurrentStreams = 16
	maxRecvMessageBytes  = 64 << 10
	maxHeaderListBytes   = 16 << 10
	windowBytes          = 64 << 10
	connWindowBytes      = 256 << 10
	ioBufferBytes        = 16 << 10
	handshakeTimeout     = 5 * time.Second
	maxConnectionIdle    = 5 * time.Minute
	keepaliveMinTime     = 10 * time.Second
)

// serverOptions are the options of both gRPC servers, before interceptors.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		// A few kept goroutines serve the streams: a stats call runs deep
		// (a source read, the conversion, the answer's size), and on a new
		// goroutine per stream the runtime copied its stack a few times
		// per call (7% of statsd's CPU in a poll). Idle workers wait on a
		// channel: they cost an idle statsd no wakeup. Busy ones leave
		// further streams to goroutines of their own, as before.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.MaxRecvMsgSize(maxRecvMessageBytes),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.InitialWindowSize(windowBytes),
		grpc.InitialConnWindowSize(connWindowBytes),
		grpc.ReadBufferSize(ioBufferBytes),
		grpc.WriteBufferSize(ioBufferBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: maxConnectionIdle}),
	}
}

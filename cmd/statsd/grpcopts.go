package main

// This file is the gRPC server's resource limits, the same on both sockets:
// requests are tiny, pollers few, and nothing a client sends may make
// statsd hold more than a bounded amount per connection.

import (
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

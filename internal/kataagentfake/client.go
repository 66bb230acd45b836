package kataagentfake

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/containerd/ttrpc"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// BareClient is a bare ttrpc client to the fake: the Unix socket, the
// CONNECT handshake, nothing else. Benchmarks use it as the baseline of an
// agent read.
type BareClient struct {
	*ttrpc.Client
}

// DialBare connects to the fake the way a VMM's hybrid-vsock socket is
// reached (or plainly, for HandshakeNone) and returns a ttrpc client.
func (a *Agent) DialBare(ctx context.Context) (*BareClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", a.path)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	mode, port := a.handshake, a.port
	a.mu.Unlock()
	if mode != HandshakeNone {
		if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
			conn.Close()
			return nil, err
		}
		line, err := readLine(conn)
		if err != nil || !strings.HasPrefix(line, "OK ") {
			conn.Close()
			return nil, fmt.Errorf("kataagentfake: handshake answered %q: %v", line, err)
		}
	}
	return &BareClient{ttrpc.NewClient(conn)}, nil
}

// StatsContainer is one bare grpc.AgentService/StatsContainer round trip.
func (c *BareClient) StatsContainer(ctx context.Context, id string) (*katagrpc.StatsContainerResponse, error) {
	var resp katagrpc.StatsContainerResponse
	err := c.Call(ctx, "grpc.AgentService", "StatsContainer", &katagrpc.StatsContainerRequest{ContainerId: id}, &resp)
	return &resp, err
}

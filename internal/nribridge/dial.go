package nribridge

// The connection to a statsd (split from shard.go).

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/peercred"
)

// dial makes a client of the statsd socket at path (connecting at its first
// call), checking at every connection that the server runs as an allowed
// uid: the bridge tells it pods' identities.
func dial(path string, allow []uint32) (*grpc.ClientConn, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("nribridge: statsd socket %s: %w", path, err)
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", abs)
		if err != nil {
			return nil, err
		}
		uid, _, err := peercred.PeerUID(conn)
		if err == nil && !slices.Contains(allow, uid) {
			err = fmt.Errorf("the server runs as uid %d, not one of %v", uid, allow)
		}
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("nribridge: refused statsd %s: %w", abs, err)
		}
		return conn, nil
	}
	cc, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialer))
	if err != nil {
		return nil, fmt.Errorf("nribridge: statsd socket %s: %w", abs, err)
	}
	return cc, nil
}

// Command grpcfloor is the smallest Go gRPC daemon a sandbox's neighbour
// could be: grpc.health.v1 and reflection on a Unix socket, nothing else.
// TestIntegrationStatsdMemory measures statsd's memory against it. It is
// built by the test only (testdata is outside ./...).
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcfloor:", err)
		os.Exit(1)
	}
}

// run serves health and reflection on the Unix socket named by the one
// argument until ctx is done.
func run(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: grpcfloor SOCKET")
	}
	lis, err := net.Listen("unix", args[0])
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	return srv.Serve(lis)
}

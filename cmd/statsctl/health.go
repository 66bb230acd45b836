package main

import (
	"context"
	"fmt"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func runHealth(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "health", "Print statsd's grpc.health.v1 serving status")
	var (
		conn    connFlags
		service string
	)
	conn.register(fs, defaultSocket, "stats")
	fs.StringVar(&service, "service", "", `service to check ("" is the whole daemon)`)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	ctx, cc, done, err := conn.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("statsd is %s", resp.GetStatus())
	}
	return nil
}

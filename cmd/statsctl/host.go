package main

import (
	"context"
	"fmt"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runHost(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "host", "Print the runner-layer (host) view of the named workload's sandbox")
	var (
		conn     connFlags
		out      outputFlag
		actorUID string
	)
	conn.register(fs, defaultSocket, "stats")
	out.register(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the actor you believe runs there (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if actorUID == "" {
		return usageError{fmt.Errorf("--actor-uid is required")}
	}
	cc, err := conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, conn.timeout)
	defer cancel()
	resp, err := sandboxstatsv1.NewWorkloadStatsServiceClient(cc).StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: actorUID})
	if err != nil {
		return err
	}
	return writeJSON(e.stdout, resp)
}

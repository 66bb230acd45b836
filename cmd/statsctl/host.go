package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runHost(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "host", "Print the runner-layer (host) view of the named workload's sandbox; with --window, the cumulative counters' differences and rates over a window")
	var (
		conn     connFlags
		out      outputFlag
		actorUID string
		window   time.Duration
	)
	conn.register(fs, defaultSocket, "stats")
	out.register(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the actor you believe runs there (required)")
	fs.DurationVar(&window, "window", 0, "take two samples this far apart and print differences and rates (cumulative counters only)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if actorUID == "" {
		return usageError{fmt.Errorf("--actor-uid is required")}
	}
	if window < 0 {
		return usageError{fmt.Errorf("--window must not be negative")}
	}
	cc, err := conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	client := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
	sample := func() (*sandboxstatsv1.StatsHostResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, conn.timeout)
		defer cancel()
		return client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: actorUID})
	}

	before, err := sample()
	if err != nil {
		return err
	}
	if window == 0 {
		if out.format == "json" {
			return writeJSON(e.stdout, before)
		}
		return writeHostSample(e.stdout, before.GetHost())
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(window):
	}
	after, err := sample()
	if err != nil {
		return err
	}
	report := rate.Window(before.GetHost(), after.GetHost(), 0)
	if before.GetEpochUnixNano() != after.GetEpochUnixNano() {
		report.Findings = append(report.Findings, fmt.Sprintf("the workload was re-bound during the window (epoch %s -> %s): differences span two activations",
			formatTime(before.GetEpochUnixNano()), formatTime(after.GetEpochUnixNano())))
	}
	if out.format == "json" {
		enc := json.NewEncoder(jsonSafeWriter{e.stdout})
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	return writeHostWindow(e.stdout, report)
}

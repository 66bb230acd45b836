package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runWatch(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "watch", "Sample repeatedly and print CPU cores used per interval and memory; an epoch reset is marked, never a negative rate")
	var (
		conn     connFlags
		out      outputFlag
		actorUID string
		interval time.Duration
		count    int
	)
	conn.register(fs, defaultSocket, "stats")
	out.register(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the actor you believe runs there (empty: whatever the discovery read returns)")
	fs.DurationVar(&interval, "interval", 5*time.Second, "time between samples")
	fs.IntVar(&count, "count", 0, "stop after this many samples (0: until interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if interval <= 0 || count < 0 {
		return usageError{fmt.Errorf("--interval must be positive and --count not negative")}
	}
	cc, err := conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	client := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)

	rows := rate.NewTableWriter(e.stdout)
	if out.format == "json" {
		rows = rate.NewJSONWriter(e.stdout)
	}
	watchers := map[string]*rate.Watcher{} // one series per actor
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for n := 0; count == 0 || n < count; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return nil // Ctrl-C ends a watch normally
			case <-ticker.C:
			}
		}
		samples, err := watchOnce(ctx, client, actorUID, conn.timeout)
		if err != nil {
			// One failed poll is a line, not the end of the watch.
			fmt.Fprintf(e.stderr, "statsctl watch: %s\n", describeError(err))
			continue
		}
		for _, s := range samples {
			w := watchers[s.GetActorUid()]
			if w == nil {
				w = &rate.Watcher{}
				watchers[s.GetActorUid()] = w
			}
			if err := rows.WriteRow(w.Observe(s)); err != nil {
				return err
			}
		}
	}
	return nil
}

func watchOnce(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, actorUID string, timeout time.Duration) ([]*sandboxstatsv1.WorkloadStatsSample, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if actorUID != "" {
		resp, err := client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: actorUID})
		if err != nil {
			return nil, err
		}
		return []*sandboxstatsv1.WorkloadStatsSample{resp.GetSample()}, nil
	}
	resp, err := client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		return nil, err
	}
	if len(resp.GetSamples()) == 0 {
		return nil, fmt.Errorf("no sample: %s", resp.GetNoSampleDetail())
	}
	return resp.GetSamples(), nil
}

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

func runPoll(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "poll", "Poll every statsd whose socket matches a glob once, as the node agent does, and print what it would see")
	var (
		glob        string
		concurrency int
		timeout     time.Duration
	)
	fs.StringVar(&glob, "sockets", "/run/statsd/*.sock", "glob of statsd stats sockets")
	fs.IntVar(&concurrency, "concurrency", 8, "daemons polled at once")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "deadline of each daemon's call")
	if err := parse(fs, args); err != nil {
		return err
	}
	if concurrency < 1 || timeout <= 0 {
		return usageError{fmt.Errorf("--concurrency must be at least 1 and --timeout positive")}
	}
	results, err := sweep.Sweep(ctx, glob, concurrency, timeout)
	if err != nil {
		return usageError{err}
	}
	return nodeagent.WritePollTable(e.stdout, results)
}

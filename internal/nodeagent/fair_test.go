package nodeagent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// slowDaemon answers StatsActiveWorkloads with no sample after delay, as
// statsd does when a guest hangs (its reads wait for their deadline).
type slowDaemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	delay time.Duration
	calls atomic.Int64
}

func (d *slowDaemon) StatsActiveWorkloads(ctx context.Context, _ *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	d.calls.Add(1)
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD}, nil
}

func startSlow(t *testing.T, socket string, delay time.Duration) *slowDaemon {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	d := &slowDaemon{delay: delay}
	srv := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, d)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return d
}

// TestSweepFair: 30 daemons that answer slowly, and one healthy daemon
// that appears after the first sweep. Before: the daemons that answered
// last time went first in sorted order, so the slow ones used up every
// sweep's bound and the healthy one was skipped in every sweep (0 calls).
// Now every daemon gets its turn, a daemon skipped last time first: the
// healthy one is polled at least every second sweep, and every slow one
// at least once in 5 sweeps of about 8 slow polls each.
func TestSweepFair(t *testing.T) {
	dir := t.TempDir()
	var slow []*slowDaemon
	for i := range 30 {
		slow = append(slow, startSlow(t, filepath.Join(dir, fmt.Sprintf("a-slow%02d.sock", i)), 200*time.Millisecond))
	}
	// 2 slots x 900 ms: about 8 slow polls a sweep, for 31 daemons.
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: time.Second,
		SweepTimeout: 900 * time.Millisecond, Concurrency: 2, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SweepOnce(context.Background())
	healthy := statsdfake.Start(t, filepath.Join(dir, "z-healthy.sock"))
	warm := make([]int64, len(slow))
	for i, d := range slow {
		warm[i] = d.calls.Load()
	}
	const sweeps = 5
	var polled []bool
	for range sweeps {
		before := healthy.Calls()
		res := a.SweepOnce(context.Background())
		skipped := 0
		for _, r := range res {
			if r.Status == sweep.StatusSkipped {
				skipped++
			}
		}
		polled = append(polled, healthy.Calls() > before)
		t.Logf("sweep: %d daemons, %d skipped, healthy polled %v", len(res), skipped, healthy.Calls() > before)
	}
	t.Logf("healthy daemon: %d calls in %d sweeps", healthy.Calls(), sweeps)
	for i := 1; i < len(polled); i++ {
		if !polled[i-1] && !polled[i] {
			t.Errorf("the healthy daemon was not polled in sweeps %d and %d in a row (polled: %v)", i, i+1, polled)
			break
		}
	}
	for i, d := range slow {
		if n := d.calls.Load() - warm[i]; n < 1 {
			t.Errorf("slow daemon %d not polled in %d sweeps", i, sweeps)
		}
	}
}

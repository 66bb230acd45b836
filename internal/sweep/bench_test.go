package sweep

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// benchConcurrency is the agent's default --concurrency.
const benchConcurrency = 8

// TestFleetHelper is not a test: the sweep benchmarks re-run the test
// binary with it to serve their fake daemons from another process, so that
// a benchmark's CPU figure is the poller's alone.
func TestFleetHelper(t *testing.T) {
	statsdfake.ServeFleet(t, func(i int) *sandboxstatsv1.StatsActiveWorkloadsResponse {
		return &sandboxstatsv1.StatsActiveWorkloadsResponse{
			Samples: []*sandboxstatsv1.WorkloadStatsSample{sample(fmt.Sprintf("actor-%04d", i), uint64(i)*1000, 64<<20)}}
	})
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSweep200 and BenchmarkSweep1000: one sweep over 200 or 1000
// fake daemons (served by a child process) at concurrency 8, the agent's
// default, against its floor measured in the same run: n/8 sequential
// single polls on the same fakes (baseline), that is n/8 times one poll's
// latency, so each variant's ratio is its ratio to the floor.
//
//   - baseline: n/8 polls one after the other, each as the agent makes it
//     (on its kept connection).
//   - pool: one sweep as the agent makes it (sweep.Pool: connections kept
//     across sweeps).
//   - pool-concurrency-1: the same sweep one poll at a time: n times one
//     poll, so 8x the floor if concurrency gained nothing. On this 2-core
//     machine (agent and daemons on the same cores) at most 2 polls run at
//     once, which bounds the gain of concurrency: a sweep at concurrency 8
//     cannot come below about 4x the floor here.
//   - dial-per-poll: one sweep dialing every daemon afresh (Config.Sweep,
//     as statsctl poll does, and the agent did before the Pool).
//
// cpu-us/daemon is the benchmark process's user+system CPU
// (getrusage(RUSAGE_SELF)) per daemon polled: the poller's alone.
func BenchmarkSweep200(b *testing.B)  { benchSweep(b, 200) }
func BenchmarkSweep1000(b *testing.B) { benchSweep(b, 1000) }

func benchSweep(b *testing.B, n int) {
	// The poller holds a socket per daemon; the fleet (another process)
	// raises its own limit.
	statsdfake.EnsureNoFile(b, n+64)
	glob := filepath.Join(statsdfake.StartFleet(b, "TestFleetHelper", n), "d*.sock")
	sockets, err := Discover(glob)
	if err != nil || len(sockets) != n {
		b.Fatalf("found %d sockets, want %d (%v)", len(sockets), n, err)
	}
	ctx := context.Background()
	cfg := Config{Concurrency: benchConcurrency, Timeout: 5 * time.Second}
	allOK := func(b *testing.B, results []DaemonResult) {
		for _, r := range results {
			if r.Status != StatusOK {
				b.Fatalf("%s: %s %v", r.Socket, r.Status, r.Err)
			}
		}
	}
	// run times op, which polls daemons daemons, and reports the CPU per
	// daemon.
	run := func(b *testing.B, daemons int, op func()) {
		c0 := cpuTime(b)
		for b.Loop() {
			op()
		}
		b.ReportMetric(float64(cpuTime(b)-c0)/float64(time.Microsecond)/float64(b.N*daemons), "cpu-us/daemon")
	}
	b.Run("baseline", func(b *testing.B) {
		pool := cfg.NewPool()
		defer pool.Close()
		allOK(b, pool.PollAll(ctx, sockets)) // connect them all first
		polls, i := n/benchConcurrency, 0
		run(b, polls, func() {
			for range polls {
				if r := pool.p.pollDaemon(ctx, sockets[i%n], pool.poll); r.Status != StatusOK {
					b.Fatalf("%s: %s %v", r.Socket, r.Status, r.Err)
				}
				i++
			}
		})
	})
	b.Run("pool", func(b *testing.B) {
		pool := cfg.NewPool()
		defer pool.Close()
		allOK(b, pool.PollAll(ctx, sockets)) // connect them all first, as the agent's first sweep
		run(b, n, func() {
			results, err := pool.Sweep(ctx, glob)
			if err != nil {
				b.Fatal(err)
			}
			allOK(b, results)
		})
	})
	b.Run("pool-concurrency-1", func(b *testing.B) {
		c := cfg
		c.Concurrency = 1
		pool := c.NewPool()
		defer pool.Close()
		allOK(b, pool.PollAll(ctx, sockets))
		run(b, n, func() {
			results, err := pool.Sweep(ctx, glob)
			if err != nil {
				b.Fatal(err)
			}
			allOK(b, results)
		})
	})
	b.Run("dial-per-poll", func(b *testing.B) {
		run(b, n, func() {
			results, err := cfg.Sweep(ctx, glob)
			if err != nil {
				b.Fatal(err)
			}
			allOK(b, results)
		})
	})
}

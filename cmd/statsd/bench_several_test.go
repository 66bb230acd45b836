package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// severalBench is statsd's stats service with several real v1 cgroups
// bound, one per actor ("actor-00" ...), on a Unix socket.
type severalBench struct {
	stats  sandboxstatsv1.WorkloadStatsServiceClient
	health healthpb.HealthClient
	rels   []string // the bound cgroups, by actor index
}

// serveSeveral makes n real v1 cgroups and serves a statsd with all of them
// bound, with the real source wiring and server options.
func serveSeveral(b *testing.B, n int) *severalBench {
	b.Helper()
	cfg := config{procRoot: "/proc", cgroupRoot: "/sys/fs/cgroup", debugfsRoot: "/sys/kernel/debug", readTimeout: 2 * time.Second}
	logger := slog.New(slog.DiscardHandler)
	store, err := identity.NewStore(identity.Config{Open: opener(cfg, logger), MaxWorkloads: identity.LimitMaxWorkloads})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	sb := &severalBench{}
	for i := range n {
		rel := benchV1Cgroup(b)
		sb.rels = append(sb.rels, rel)
		if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: fmt.Sprintf("actor-%02d", i)},
			source.SandboxRef{Class: source.ClassGVisor, CgroupPath: rel}); err != nil {
			b.Fatal(err)
		}
	}
	sb.stats, sb.health = serveStoreForBench(b, store, logger)
	return sb
}

// BenchmarkStatsWorkloadAmong32 compares the keyed read of one actor among
// 32 bound to real v1 cgroups with the same read with one bound: finding
// the actor's binding among several must cost nothing measurable. Goal:
// 1.1x.
func BenchmarkStatsWorkloadAmong32(b *testing.B) {
	one, many := serveSeveral(b, 1), serveSeveral(b, 32)
	read := func(b *testing.B, sb *severalBench, actor string) {
		req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: actor}
		if _, err := sb.stats.StatsWorkload(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sb.stats.StatsWorkload(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("baseline", func(b *testing.B) { read(b, one, "actor-00") })
	b.Run("among-32", func(b *testing.B) {
		read(b, many, "actor-17")
		b.ReportMetric(1.1, benchtableGoal)
	})
}

// BenchmarkStatsActiveWorkloads32 compares one discovery read of 32 actors
// bound to real v1 cgroups with its floor: a gRPC health round trip plus
// reading in-process the 15 files of each of the 32 samples (os.ReadFile
// each, no parsing, one after the other). Goal: 1.5x.
func BenchmarkStatsActiveWorkloads32(b *testing.B) {
	sb := serveSeveral(b, 32)
	var files []string
	for _, rel := range sb.rels {
		files = append(files, v1SampleFiles("/sys/fs/cgroup", rel)...)
	}
	resp, err := sb.stats.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || len(resp.GetSamples()) != 32 {
		b.Fatalf("discovery read: %d samples, %d pending, %v", len(resp.GetSamples()), len(resp.GetPending()), err)
	}
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sb.health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
			for _, p := range files {
				if _, err := os.ReadFile(p); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("unix-socket", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sb.stats.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(1.5, benchtableGoal)
	})
}

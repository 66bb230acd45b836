package main

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// serveForBench serves statsd's stats service, with the real source wiring,
// on a Unix socket, binds ref and returns a client.
func serveForBench(b *testing.B, ref source.SandboxRef) sandboxstatsv1.WorkloadStatsServiceClient {
	client, _ := serveForBenchWithHealth(b, ref)
	return client
}

// serveForBenchWithHealth also returns a health client on the same
// connection: a gRPC round trip that reads nothing, the floor under every
// StatsWorkload.
func serveForBenchWithHealth(b *testing.B, ref source.SandboxRef) (sandboxstatsv1.WorkloadStatsServiceClient, healthpb.HealthClient) {
	b.Helper()
	cfg := config{procRoot: "/proc", cgroupRoot: "/sys/fs/cgroup", debugfsRoot: "/sys/kernel/debug", readTimeout: 2 * time.Second}
	logger := slog.New(slog.DiscardHandler)
	store, err := identity.NewStore(identity.Config{Open: opener(cfg, logger)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "bench"}, ref); err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "statsd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(server.UnaryInterceptors(logger))
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, server.NewStatsService(store, nil, logger))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return sandboxstatsv1.NewWorkloadStatsServiceClient(cc), healthpb.NewHealthClient(cc)
}

// ownCgroupFiles returns the four files the targeted reader reads for this
// process's own (real) cgroup.
func ownCgroupFiles(b *testing.B) []string {
	b.Helper()
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		b.Skip(err)
	}
	defer f.Close()
	paths := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = parts[2]
		}
		if parts[0] == "0" {
			paths["unified"] = parts[2]
		}
	}
	if mem, ok := paths["memory"]; ok { // v1 (hybrid or legacy)
		m := filepath.Join("/sys/fs/cgroup/memory", mem)
		files := []string{m + "/memory.usage_in_bytes", m + "/memory.max_usage_in_bytes", m + "/memory.stat"}
		if cpu := paths["cpuacct"]; cpu != "/" { // the source does not read a root cpuacct counter either
			files = append(files, filepath.Join("/sys/fs/cgroup/cpuacct", cpu, "cpuacct.usage"))
		}
		return files
	}
	d := filepath.Join("/sys/fs/cgroup", paths["unified"])
	return []string{d + "/memory.current", d + "/memory.peak", d + "/memory.stat", d + "/cpu.stat"}
}

// BenchmarkStatsWorkloadCgroup compares one StatsWorkload over a Unix socket,
// gVisor source on this process's real cgroup, with reading the same files
// directly in-process.
func BenchmarkStatsWorkloadCgroup(b *testing.B) {
	files := ownCgroupFiles(b)
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			for _, p := range files {
				if _, err := os.ReadFile(p); err != nil && !os.IsNotExist(err) {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("unix-socket", func(b *testing.B) {
		client := serveForBench(b, source.SandboxRef{Class: source.ClassGVisor, SentryPID: os.Getpid()})
		req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench"}
		if _, err := client.StatsWorkload(context.Background(), req); err != nil {
			b.Skipf("own cgroup not measurable here: %v", err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := client.StatsWorkload(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStatsWorkloadAgent compares one StatsWorkload over a Unix socket,
// micro-VM source, with a bare ttrpc StatsContainer round trip to the same
// fake agent (target: below 1.5x).
func BenchmarkStatsWorkloadAgent(b *testing.B) {
	agent := kataagentfake.New(b, b.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{
		UsageBytes: 200 << 20, MaxUsageBytes: 300 << 20, InactiveFileBytes: 10 << 20, CPUTotal: 1_000_000_000,
	})))
	b.Run("baseline", func(b *testing.B) {
		client, err := agent.DialBare(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close()
		for b.Loop() {
			if _, err := client.StatsContainer(context.Background(), "web"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("grpc-health-floor", func(b *testing.B) {
		_, health := serveForBenchWithHealth(b, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}})
		for b.Loop() {
			if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unix-socket", func(b *testing.B) {
		client := serveForBench(b, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}})
		req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench"}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := client.StatsWorkload(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

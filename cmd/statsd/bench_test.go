package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// serveForBenchWithHealth serves statsd's stats service, with the real
// source wiring and server options, on a Unix socket, binds ref and returns
// a client and a health client on the same connection: a gRPC round trip
// that reads nothing, part of the floor under every StatsWorkload.
func serveForBenchWithHealth(b testing.TB, ref source.SandboxRef) (sandboxstatsv1.WorkloadStatsServiceClient, healthpb.HealthClient) {
	b.Helper()
	return serveConfigForBench(b, config{procRoot: "/proc", cgroupRoot: "/sys/fs/cgroup", debugfsRoot: "/sys/kernel/debug", readTimeout: benchReadTimeout}, ref)
}

// benchReadTimeout is the benchmarks' --read-timeout: a micro-VM source's
// CallTimeout, the deadline of each agent call.
const benchReadTimeout = 2 * time.Second

// serveConfigForBench is serveForBenchWithHealth with statsd's config cfg.
func serveConfigForBench(b testing.TB, cfg config, ref source.SandboxRef) (sandboxstatsv1.WorkloadStatsServiceClient, healthpb.HealthClient) {
	b.Helper()
	logger := slog.New(slog.DiscardHandler)
	store, err := identity.NewStore(identity.Config{Open: opener(cfg, logger)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "bench"}, ref); err != nil {
		b.Fatal(err)
	}
	return serveStoreForBench(b, store, logger)
}

// serveStoreForBench serves store's stats service and health, with
// statsd's server options, on a Unix socket and returns their clients on
// one connection.
func serveStoreForBench(b testing.TB, store *identity.Store, logger *slog.Logger) (sandboxstatsv1.WorkloadStatsServiceClient, healthpb.HealthClient) {
	b.Helper()
	sock := filepath.Join(b.TempDir(), "statsd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(append(serverOptions(), server.UnaryInterceptors(logger))...)
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

// benchV1Hierarchies are the v1 hierarchies a bound sandbox cgroup is made
// in for the benchmark (those one v1 sample reads).
var benchV1Hierarchies = []string{"memory", "cpuacct", "cpu", "pids", "blkio"}

// v1SampleFiles are the 15 files one v1 sample of the cgroup rel reads
// (readV1): memory usage, max, stat, limit, oom_control and cgroup.procs,
// cpuacct.usage, the CFS period, quota and cpu.stat, pids.current and
// pids.max, both blkio throttle files and the blkio root's
// io_service_bytes.
func v1SampleFiles(root, rel string) []string {
	in := func(h string, names ...string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = filepath.Join(root, h, rel, n)
		}
		return out
	}
	files := in("memory", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.stat",
		"memory.limit_in_bytes", "memory.oom_control", "cgroup.procs")
	files = append(files, in("cpuacct", "cpuacct.usage")...)
	files = append(files, in("cpu", "cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.stat")...)
	files = append(files, in("pids", "pids.current", "pids.max")...)
	files = append(files, in("blkio", "blkio.throttle.io_service_bytes", "blkio.throttle.io_serviced")...)
	return append(files, filepath.Join(root, "blkio", "blkio.throttle.io_service_bytes"))
}

// benchV1Cgroup makes a cgroup in every hierarchy of benchV1Hierarchies on
// this (v1 or hybrid) host and returns its path; it skips without root or
// on a unified host.
func benchV1Cgroup(b *testing.B) string {
	b.Helper()
	const root = "/sys/fs/cgroup"
	if os.Geteuid() != 0 {
		b.Skip("needs root to make a v1 cgroup")
	}
	for _, h := range benchV1Hierarchies {
		if _, err := os.Stat(filepath.Join(root, h, "cgroup.procs")); err != nil {
			b.Skipf("needs the v1 %s hierarchy: %v", h, err)
		}
	}
	rel := "/sbsbench-statsd-" + filepath.Base(b.TempDir())
	var dirs []string
	for _, h := range benchV1Hierarchies {
		dirs = append(dirs, filepath.Join(root, h, rel))
	}
	testenv.MakeCgroup(b, dirs...)
	return rel
}

// BenchmarkStatsWorkloadCgroup compares one StatsWorkload over a Unix socket,
// gVisor source bound by cgroup path to a real v1 cgroup, with its floor:
// a gRPC health round trip on the same connection plus reading in-process
// the 15 files one sample reads (os.ReadFile each, no parsing). Goal: 1.3x.
func BenchmarkStatsWorkloadCgroup(b *testing.B) {
	rel := benchV1Cgroup(b)
	files := v1SampleFiles("/sys/fs/cgroup", rel)
	client, health := serveForBenchWithHealth(b, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: rel})
	req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench"}
	if _, err := client.StatsWorkload(context.Background(), req); err != nil {
		b.Fatalf("the cgroup %s is not measurable: %v", rel, err)
	}
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
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
			if _, err := client.StatsWorkload(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(1.3, benchtableGoal)
	})
}

// deadlineOnly is a context whose deadline is always timeout away and that
// is never done: a ttrpc client sends the deadline to the server and arms
// nothing.
type deadlineOnly struct {
	context.Context
	timeout time.Duration
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return time.Now().Add(c.timeout), true }

// benchtableGoal is the unit of the metric by which a benchmark declares
// the ratio to its group's baseline it must stay under (internal/benchtable
// prints it beside the ratio and says whether it holds).
const benchtableGoal = "goal-x"

// BenchmarkStatsWorkloadAgent compares one StatsWorkload over a Unix socket,
// micro-VM source, with its floor: a gRPC health round trip on the same
// connection plus a bare ttrpc StatsContainer round trip to the same fake
// agent (sent the deadline statsd's calls carry: the fake's work is in the
// figures, and is the same for both). Goal: 1.3x, asked as statsctl asks (known_absent: the values a
// guest agent never offers come as codes, expanded into texts as statsctl
// expands them); unix-socket-text asks without it, as an older client does.
func BenchmarkStatsWorkloadAgent(b *testing.B) {
	agent := kataagentfake.New(b, b.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{
		UsageBytes: 200 << 20, MaxUsageBytes: 300 << 20, InactiveFileBytes: 10 << 20, CPUTotal: 1_000_000_000,
	})))
	client, health := serveForBenchWithHealth(b, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}})
	req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench", KnownAbsent: true}
	if _, err := client.StatsWorkload(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.Run("baseline", func(b *testing.B) {
		bare, err := agent.DialBare(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer bare.Close()
		// The fake agent runs in this process: it gets the deadline
		// statsd's calls carry, so it does the same work for both (ttrpc
		// sends it as timeout_nano and the agent's server arms a timer
		// for it). The client side stays bare: no timer of its own.
		agentCtx := deadlineOnly{Context: context.Background(), timeout: benchReadTimeout}
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
			if _, err := bare.StatsContainer(agentCtx, "web"); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	poll := func(b *testing.B, req *sandboxstatsv1.StatsWorkloadRequest) {
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			resp, err := client.StatsWorkload(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			api.ExpandKnownAbsent(resp.GetSample()) // as statsctl does
		}
		reportCPU(b, cpu)
	}
	b.Run("unix-socket", func(b *testing.B) {
		poll(b, req)
		b.ReportMetric(1.3, benchtableGoal)
	})
	b.Run("unix-socket-text", func(b *testing.B) {
		poll(b, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench"})
	})
}

package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// startStatsd runs statsd's run() on sockets in a temp dir until the test ends.
func startStatsd(t *testing.T) (dir string, stop func() error) {
	t.Helper()
	return startStatsdIn(t, t.TempDir(), io.Discard)
}

// startStatsdIn runs statsd on sockets and state in dir, logging to logs.
func startStatsdIn(t *testing.T, dir string, logs io.Writer, extra ...string) (string, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{
			"--listen", filepath.Join(dir, "statsd.sock"),
			"--lifecycle-listen", filepath.Join(dir, "lifecycle.sock"),
			"--state-dir", filepath.Join(dir, "state"),
		}, extra...), logs)
	}()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("statsd did not stop")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	waitForSocket(t, filepath.Join(dir, "lifecycle.sock"))
	return dir, stop
}

func waitForSocket(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("%s never accepted a connection", path)
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestStatsdServesHealthAndReflection(t *testing.T) {
	dir, stop := startStatsd(t)
	statsSock, lifeSock := filepath.Join(dir, "statsd.sock"), filepath.Join(dir, "lifecycle.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	for path, mode := range map[string]os.FileMode{statsSock: 0o660, lifeSock: 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != mode {
			t.Errorf("%s mode %v, want %v", filepath.Base(path), got, mode)
		}
	}

	cc := dial(t, statsSock)
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", resp.GetStatus(), err)
	}

	listServices := func(cc *grpc.ClientConn) []string {
		sctx, scancel := context.WithCancel(ctx)
		defer scancel() // end the stream, or graceful shutdown waits for it
		stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range r.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names
	}
	stats := listServices(cc)
	if !slices.Contains(stats, sandboxstatsv1.WorkloadStatsService_ServiceDesc.ServiceName) ||
		slices.Contains(stats, sandboxstatsv1.WorkloadLifecycleService_ServiceDesc.ServiceName) {
		t.Errorf("stats socket lists %v: want the stats service and not the lifecycle one", stats)
	}
	life := listServices(dial(t, lifeSock))
	if !slices.Contains(life, sandboxstatsv1.WorkloadLifecycleService_ServiceDesc.ServiceName) {
		t.Errorf("lifecycle socket lists %v", life)
	}

	// The discovery read answers normally with nothing bound.
	active, err := sandboxstatsv1.NewWorkloadStatsServiceClient(cc).StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || active.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD {
		t.Fatalf("active = %v, %v", active, err)
	}

	if err := stop(); err != nil {
		t.Fatalf("run returned %v after a clean shutdown", err)
	}
	for _, p := range []string{statsSock, lifeSock} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after shutdown", p)
		}
	}
}

func TestStatsdKeepsWorkloadAcrossRestart(t *testing.T) {
	dir, stop := startStatsd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	life := sandboxstatsv1.NewWorkloadLifecycleServiceClient(dial(t, filepath.Join(dir, "lifecycle.sock")))
	_, err := life.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-a"},
		Sandbox:  &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/sandboxstats-test-does-not-exist"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Restart on the same state dir (new sockets in the same place).
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx2, []string{
			"--listen", filepath.Join(dir, "statsd.sock"),
			"--lifecycle-listen", filepath.Join(dir, "lifecycle.sock"),
			"--state-dir", filepath.Join(dir, "state"),
			"--max-workloads", "1",
		}, io.Discard)
	}()
	waitForSocket(t, filepath.Join(dir, "statsd.sock"))
	active, err := sandboxstatsv1.NewWorkloadStatsServiceClient(dial(t, filepath.Join(dir, "statsd.sock"))).StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The cgroup does not exist, so the workload is bound but not measurable.
	if active.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET {
		t.Fatalf("after restart: %v, want the workload still bound (not measurable)", active)
	}
	_, err = sandboxstatsv1.NewWorkloadLifecycleServiceClient(dial(t, filepath.Join(dir, "lifecycle.sock"))).RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-b"},
		Sandbox:  &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, SentryPid: 1},
	})
	// The restored binding counts against the ceiling.
	if status.Code(err) != codes.ResourceExhausted || api.ReasonOf(err) != "TOO_MANY_WORKLOADS" {
		t.Fatalf("a second workload beside the restored one with --max-workloads 1: %v, want RESOURCE_EXHAUSTED TOO_MANY_WORKLOADS", err)
	}
	cancel2()
	<-errc
}

func TestListenUnixRefusesLiveSocketAndReplacesStale(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.sock")
	lis, cleanup, err := listenUnix(p, 0o700, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := listenUnix(p, 0o700, 0o600, -1); err == nil {
		t.Fatal("listened over a live socket")
	}
	// A stale socket (its listener closed without unlinking) is replaced.
	lis.Close()
	lis2, cleanup2, err := listenUnix(p, 0o700, 0o600, -1)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer lis2.Close()
	cleanup() // the first listener's cleanup must not remove the new socket
	if _, err := os.Lstat(p); err != nil {
		t.Fatal("cleanup removed a socket this listener did not create")
	}
	cleanup2()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatal("socket not removed by its creator")
	}
	// A regular file is never removed.
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o600)
	if _, _, err := listenUnix(f, 0o700, 0o600, -1); err == nil {
		t.Fatal("listened over a regular file")
	}
}

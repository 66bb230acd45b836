package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// This file runs a benchmark's statsd in a process of its own, as statsd
// runs: one Go processor (internal/oneproc), no client beside it. The
// gVisor breakdown's rows use it: in the test process the daemon would
// share the runtime with the benchmark's client and the other rows'
// servers, and have the test binary's processors (processors_test.go),
// which schedule the breakdown's worker otherwise than statsd's one does.

// benchDaemonEnv, set in this test binary's environment, makes it a
// benchmark's statsd (TestMain): the JSON of a benchDaemonSpec.
const benchDaemonEnv = "SANDBOXSTATS_BENCH_DAEMON"

// benchDaemonSpec is what a benchmark's statsd serves: the stats service
// on Socket, with one gVisor workload ("bench") bound by SentryPID, and
// statsd's --runsc-root and its sentry connection's keep time.
type benchDaemonSpec struct {
	Socket     string
	SentryPID  int
	RunscRoots []string
	KeepFor    time.Duration
}

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(benchDaemonEnv); ok {
		if err := benchDaemon(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench statsd:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// benchDaemon serves spec until its standard input is closed (the
// benchmark's cleanup, or the benchmark's end).
func benchDaemon(spec string) error {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1) // as internal/oneproc: processors_test.go gave the default back
	}
	var s benchDaemonSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("%s: %w", benchDaemonEnv, err)
	}
	cfg := config{procRoot: "/proc", cgroupRoot: "/sys/fs/cgroup", debugfsRoot: "/sys/kernel/debug", readTimeout: 2 * time.Second, runscRoots: s.RunscRoots, sentryKeepFor: s.KeepFor}
	logger := slog.New(slog.DiscardHandler)
	store, err := identity.NewStore(identity.Config{Open: opener(cfg, logger)})
	if err != nil {
		return err
	}
	defer store.Close()
	ref := source.SandboxRef{Class: source.ClassGVisor, SentryPID: s.SentryPID}
	if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "bench"}, ref); err != nil {
		return err
	}
	lis, err := net.Listen("unix", s.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(append(serverOptions(), server.UnaryInterceptors(logger))...)
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, server.NewStatsService(store, nil, logger))
	go func() {
		io.Copy(io.Discard, os.Stdin)
		srv.Stop()
	}()
	return srv.Serve(lis)
}

// serveGVisorDaemon starts this test binary as a benchmark's statsd for the
// sentry of ref, with --runsc-root roots (none: no breakdown) and the
// sentry connection kept keepFor (0: the default, 2 s), and returns a
// client of it and its pid. b's cleanup stops it.
func serveGVisorDaemon(b *testing.B, ref source.SandboxRef, roots []string, keepFor time.Duration) (sandboxstatsv1.WorkloadStatsServiceClient, int) {
	b.Helper()
	sock := filepath.Join(b.TempDir(), "statsd.sock")
	spec, err := json.Marshal(benchDaemonSpec{Socket: sock, SentryPID: ref.SentryPID, RunscRoots: roots, KeepFor: keepFor})
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchDaemonEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	for deadline := time.Now().Add(10 * time.Second); !testenv.Listening(sock); time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			b.Fatalf("the bench statsd exited before it listened: %v", waitErr)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatal("the bench statsd did not listen within 10 s")
		}
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return sandboxstatsv1.NewWorkloadStatsServiceClient(cc), cmd.Process.Pid
}

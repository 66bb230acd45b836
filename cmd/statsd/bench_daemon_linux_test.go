package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// This file runs a benchmark's statsd as a process of its own: this test
// binary re-executed to run statsd's serve (what main runs after its
// flags: the stats and lifecycle servers, the read gate, the drift
// checker, the state directory), with one Go processor as
// internal/oneproc gives statsd, bound through the lifecycle API. The
// gVisor breakdown's rows use it: in the test process the daemon would
// share its runtime with the benchmark's client and the other rows'
// servers, with the test binary's two processors (processors_test.go),
// which schedule the breakdown's worker otherwise than statsd's one.

// benchDaemonEnv, set in the environment, makes TestBenchDaemon a
// benchmark's statsd: the JSON of a benchDaemonSpec.
const benchDaemonEnv = "SANDBOXSTATS_BENCH_DAEMON"

// benchDaemonSpec is a benchmark statsd's flags, and what no flag sets:
// how long the breakdown keeps its sentry connection (0: the default);
// ProcsFile is where it writes its Go processors, as it runs with them.
type benchDaemonSpec struct {
	Args      []string
	KeepFor   time.Duration
	ProcsFile string
}

// TestBenchDaemon is the statsd process of serveGVisorDaemon; run
// otherwise, it skips. It serves until its standard input closes.
func TestBenchDaemon(t *testing.T) {
	raw, ok := os.LookupEnv(benchDaemonEnv)
	if !ok {
		t.Skip("helper process: the statsd serveGVisorDaemon starts for a benchmark")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1) // as internal/oneproc: processors_test.go gave the default back
	}
	var spec benchDaemonSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("%s: %v", benchDaemonEnv, err)
	}
	cfg, err := parseFlags(spec.Args, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.sentryKeepFor = spec.KeepFor
	if err := os.WriteFile(spec.ProcsFile, []byte(strconv.Itoa(runtime.GOMAXPROCS(0))), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if err := serve(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench statsd:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// benchDaemon is a statsd process serveGVisorDaemon started.
type benchDaemon struct {
	pid   int
	procs int // its Go processors
}

// cpu returns the daemon's CPU so far (its process CPU clock: every
// thread's, exited ones included, in ns).
func (d benchDaemon) cpu(b testing.TB) time.Duration { return processClock(b, d.pid) }

// processClock returns process pid's CPU so far from its process CPU clock
// (CPUCLOCK_SCHED, ns; as internal/gvisor's own processes are read).
func processClock(b testing.TB, pid int) time.Duration {
	b.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^pid<<3|2), &ts); err != nil {
		b.Fatalf("clock_gettime of process %d's CPU clock: %v", pid, err)
	}
	return time.Duration(ts.Nano())
}

// serveGVisorDaemon starts this test binary as a benchmark's statsd
// (TestBenchDaemon) with --runsc-root roots (none: no breakdown) and the
// sentry connection kept keepFor (0: the default, 2 s), binds ref to actor
// "bench" through its lifecycle socket and returns a stats client of it.
// b's cleanup stops it; its log is printed when b failed.
func serveGVisorDaemon(b testing.TB, ref source.SandboxRef, roots []string, keepFor time.Duration) (sandboxstatsv1.WorkloadStatsServiceClient, benchDaemon) {
	b.Helper()
	dir := b.TempDir()
	stats, life := filepath.Join(dir, "stats.sock"), filepath.Join(dir, "lifecycle.sock")
	args := []string{"--listen", stats, "--lifecycle-listen", life, "--state-dir", filepath.Join(dir, "state"),
		"--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc", "--read-timeout", "2s", "--log-level", "warn"}
	for _, r := range roots {
		args = append(args, "--runsc-root", r)
	}
	procsFile := filepath.Join(dir, "procs")
	spec, err := json.Marshal(benchDaemonSpec{Args: args, KeepFor: keepFor, ProcsFile: procsFile})
	if err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(dir, "statsd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchDaemon$")
	cmd.Env = append(os.Environ(), benchDaemonEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = logf, logf
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
		if b.Failed() {
			out, _ := os.ReadFile(logPath)
			b.Logf("bench statsd's log:\n%s", out)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); !testenv.Listening(stats) || !testenv.Listening(life); time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			b.Fatalf("the bench statsd exited before it listened: %v", waitErr)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatal("the bench statsd did not listen within 10 s")
		}
	}
	conn := func(sock string) *grpc.ClientConn {
		cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sandboxstatsv1.NewWorkloadLifecycleServiceClient(conn(life)).RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "bench"},
		Sandbox:  &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, SentryPid: int32(ref.SentryPID)},
	}); err != nil {
		b.Fatalf("bind the bench statsd: %v", err)
	}
	raw, err := os.ReadFile(procsFile) // written before it listened
	if err != nil {
		b.Fatal(err)
	}
	procs, err := strconv.Atoi(string(raw))
	if err != nil {
		b.Fatalf("%s: %q: %v", procsFile, raw, err)
	}
	return sandboxstatsv1.NewWorkloadStatsServiceClient(conn(stats)), benchDaemon{pid: cmd.Process.Pid, procs: procs}
}

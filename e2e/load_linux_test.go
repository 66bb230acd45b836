package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// counters is one "statsd counters" log line (statsd logs it on SIGUSR1,
// after returning free memory to the system) with statsd's RSS and
// anonymous memory then. A leak grows the anonymous memory: the RSS also
// holds the binary's read-only pages, which statsd releases 5 s after its
// start (internal/exepages) and the code it runs faults back in, so the RSS
// grows after the release without a byte leaked.
type counters struct {
	goroutines int
	rssBytes   int64
	anonBytes  int64
}

// readCounters signals statsd and reads the counters line it logs.
func readCounters(t *testing.T, d *testenv.Statsd) counters {
	t.Helper()
	before, _ := os.ReadFile(d.Log)
	if err := d.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(d.Log)
		for line := range strings.Lines(string(b[len(before):])) {
			if !strings.Contains(line, `msg="statsd counters"`) {
				continue
			}
			var c counters
			for f := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(f, "goroutines="); ok {
					c.goroutines, _ = strconv.Atoi(v)
				}
			}
			c.rssBytes, _ = procMemory(t, d.Cmd.Process.Pid)
			anon, _, err := testenv.ProcAnonymous(d.Cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			c.anonBytes = int64(anon)
			return c
		}
	}
	t.Fatal("statsd logged no counters after SIGUSR1")
	return counters{}
}

// TestIntegrationLoad: 64 pollers (each its own connection, a quarter with
// the host view) for 60 s against a statsd bound to a real v1 cgroup, while
// the launcher runs and checkpoints the workload every 100 ms. No poll and
// no lifecycle call may fail; once the pollers are gone statsd's goroutines
// and anonymous memory are back to where they started (within 10% of the
// RSS, measured after a GC that returns free memory, both times).
func TestIntegrationLoad(t *testing.T) {
	needCgroups(t)
	duration := 60 * time.Second
	if v := os.Getenv("SANDBOXSTATS_LOAD_SECONDS"); v != "" {
		n, _ := strconv.Atoi(v)
		duration = time.Duration(n) * time.Second
	}
	bin := testenv.BuildBinaries(t)
	cg := fmt.Sprintf("/sandboxstats-load-%d", os.Getpid())
	testCgroup(t, cg)
	w := testenv.StartChild(t, "TestWorkloadChild")
	moveTo(t, cg, w.Cmd.Process.Pid)
	// A small ended-activation list, filled by the warm-up: the records it
	// keeps are retention, not a leak.
	d := testenv.StartStatsd(t, bin, "--drift-interval", "0", "--ended-max", "8")
	lc := lifecycleClient(t, d.Lifecycle)
	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg}
	run(t, lc, "load-actor", ref)

	dialStats := func() (*grpc.ClientConn, sandboxstatsv1.WorkloadStatsServiceClient) {
		cc, err := grpc.NewClient("unix://"+d.Stats, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return cc, sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
	}
	// The start is statsd after a short round of the same load (every path
	// initialised: gRPC's pools, encoders' caches, the ended records).
	load(t, dialStats, lc, ref, 4*time.Second)
	time.Sleep(2 * time.Second)
	start := readCounters(t, d)
	res := load(t, dialStats, lc, ref, duration)
	time.Sleep(2 * time.Second) // the servers' connection goroutines end
	end := readCounters(t, d)
	_, peak := procMemory(t, d.Cmd.Process.Pid)
	t.Logf("measured over %v: %d polls (%d errors), %d lifecycle calls (%d errors); goroutines %d -> %d, RSS %.1f -> %.1f MiB (peak %.1f MiB), anonymous %.1f -> %.1f MiB",
		duration, res.polls, res.pollErrs, res.cycles, res.lifeErrs, start.goroutines, end.goroutines,
		float64(start.rssBytes)/(1<<20), float64(end.rssBytes)/(1<<20), float64(peak)/(1<<20),
		float64(start.anonBytes)/(1<<20), float64(end.anonBytes)/(1<<20))
	if res.pollErrs > 0 || res.lifeErrs > 0 {
		t.Errorf("%d poll errors, %d lifecycle errors; first: %v", res.pollErrs, res.lifeErrs, res.firstErr)
	}
	if !within(float64(end.goroutines), float64(start.goroutines), 0.10) {
		t.Errorf("goroutines %d after the load, %d before", end.goroutines, start.goroutines)
	}
	// Back to where it started: the anonymous memory within a tenth of the
	// RSS at the start (the slack this test gave the whole RSS before the
	// binary's pages were released).
	if d := end.anonBytes - start.anonBytes; d > start.rssBytes/10 || -d > start.rssBytes/10 {
		t.Errorf("anonymous memory %d bytes after the load, %d before (RSS %d, %d)", end.anonBytes, start.anonBytes, end.rssBytes, start.rssBytes)
	}
}

type loadResult struct {
	polls, pollErrs, cycles, lifeErrs int64
	firstErr                          any
}

// load runs 64 pollers (StatsActiveWorkloads, a quarter with the host
// view, each on its own connection) and a launcher alternating Checkpoint
// and Run every 100 ms for d, and leaves the workload bound.
func load(t *testing.T, dial func() (*grpc.ClientConn, sandboxstatsv1.WorkloadStatsServiceClient),
	lc sandboxstatsv1.WorkloadLifecycleServiceClient, ref *sandboxstatsv1.SandboxRef, d time.Duration) loadResult {
	var (
		polls, pollErrs, cycles, lifeErrs atomic.Int64
		firstErr                          atomic.Value
		wg                                sync.WaitGroup
	)
	stop := make(chan struct{})
	note := func(err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, err.Error())
		}
	}
	runReq := &sandboxstatsv1.RunWorkloadRequest{Sandbox: ref, Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "load-actor"}}
	for i := range 64 {
		wg.Go(func() {
			cc, client := dial()
			defer cc.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{IncludeHost: i%4 == 0})
				cancel()
				polls.Add(1)
				if err != nil {
					pollErrs.Add(1)
					note(err)
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		bound := true
		for {
			select {
			case <-stop:
				if !bound {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := lc.RunWorkload(ctx, runReq)
					cancel()
					note(err)
				}
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var err error
			if bound {
				_, err = lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "load-actor"})
			} else {
				_, err = lc.RunWorkload(ctx, runReq)
			}
			cancel()
			cycles.Add(1)
			if err != nil {
				lifeErrs.Add(1)
				note(err)
				continue
			}
			bound = !bound
		}
	})
	time.Sleep(d)
	close(stop)
	wg.Wait()
	return loadResult{polls: polls.Load(), pollErrs: pollErrs.Load(), cycles: cycles.Load(), lifeErrs: lifeErrs.Load(), firstErr: firstErr.Load()}
}

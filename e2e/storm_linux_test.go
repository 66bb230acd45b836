package e2e

// One admitted reader storms statsd with discovery reads (issue 34, finding
// 4): statsd's memory stays bounded, the lifecycle socket answers as usual
// meanwhile, and a quiet reader is served right after the storm.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// stormCounts are what the storm's calls got.
type stormCounts struct {
	ok, refused, late, other atomic.Int64
	firstOther, firstLate    atomic.Value
}

func (c *stormCounts) String() string {
	return fmt.Sprintf("%d answered, %d refused TOO_MANY_READS, %d past their deadline (first: %v), %d other errors (first: %v)",
		c.ok.Load(), c.refused.Load(), c.late.Load(), c.firstLate.Load(), c.other.Load(), c.firstOther.Load())
}

// The storm: 128 connections x 16 streams for 10 s.
const (
	stormConns   = 128
	stormStreams = 16
	stormFor     = 10 * time.Second
	// The storm process's environment: the read socket and how long.
	stormSocketEnv = "SANDBOXSTATS_STORM_SOCKET"
	stormForEnv    = "SANDBOXSTATS_STORM_FOR"
	// stormCountsPrefix begins the line the storm process prints last.
	stormCountsPrefix = "storm-counts:"
)

// TestDiscoveryStormChild is the storm of TestIntegrationDiscoveryStorm,
// run by it as a process of its own: stormConns connections x stormStreams
// streams of StatsActiveWorkloads on the read socket stormSocketEnv names,
// each stream calling again as soon as answered or refused, for
// stormForEnv; then it prints what the calls got. Run otherwise, it skips.
func TestDiscoveryStormChild(t *testing.T) {
	sock := os.Getenv(stormSocketEnv)
	if sock == "" {
		t.Skip("helper process of TestIntegrationDiscoveryStorm")
	}
	d, err := time.ParseDuration(os.Getenv(stormForEnv))
	if err != nil {
		t.Fatal(err)
	}
	var counts stormCounts
	stormCtx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	var wg sync.WaitGroup
	for range stormConns {
		cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		c := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
		for range stormStreams {
			wg.Go(func() {
				for stormCtx.Err() == nil {
					ctx, cancel := context.WithTimeout(stormCtx, 5*time.Second)
					callStart := time.Now()
					_, err := c.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
					cancel()
					if status.Code(err) == codes.DeadlineExceeded && stormCtx.Err() == nil {
						counts.firstLate.CompareAndSwap(nil, fmt.Sprintf("%v after %v", err, time.Since(callStart)))
					}
					switch {
					case err == nil:
						counts.ok.Add(1)
					case status.Code(err) == codes.ResourceExhausted && api.ReasonOf(err) == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS):
						counts.refused.Add(1)
					case stormCtx.Err() != nil: // the storm's end cancelled it
					case status.Code(err) == codes.DeadlineExceeded:
						counts.late.Add(1)
					default:
						counts.other.Add(1)
						counts.firstOther.CompareAndSwap(nil, err.Error())
					}
				}
			})
		}
	}
	wg.Wait()
	fmt.Println(stormCountsPrefix, counts.String())
}

// TestIntegrationDiscoveryStorm: a statsd with 32 real cgroups bound (v1 on
// a hybrid host), and 128 connections x 16 streams of StatsActiveWorkloads,
// each stream calling again as soon as answered or refused, for 10 s.
// Meanwhile a RunWorkload on the lifecycle socket every second answers
// within 1 s each; statsd's peak memory (VmHWM) stays under 64 MiB; a quiet
// reader on a fresh connection is served within 2 s of the storm's end.
func TestIntegrationDiscoveryStorm(t *testing.T) {
	needCgroups(t)
	const (
		bound       = 32
		lifeTries   = 8
		lifeBound   = time.Second
		quietBound  = 2 * time.Second
		memoryBound = 64 << 20
	)
	bin := testenv.BuildBinaries(t)
	pod := fmt.Sprintf("sbs-storm-%d", os.Getpid())
	testCgroup(t, pod)
	ref := func(name string) *sandboxstatsv1.SandboxRef {
		leaf := filepath.Join(pod, name+"-_pause")
		testCgroup(t, leaf)
		return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/" + leaf}
	}
	actor := func(i int) string { return fmt.Sprintf("actor-%02d", i) }
	refs := make([]*sandboxstatsv1.SandboxRef, bound+lifeTries)
	for i := range refs {
		refs[i] = ref(actor(i))
	}
	// The connection cap leaves the quiet reader a connection beside the
	// storm's 128: the cap is not what this test is about.
	d := testenv.StartStatsd(t, bin, "--drift-interval", "0", "--max-workloads", "64", "--max-read-connections", "160")
	lc := lifecycleClient(t, d.Lifecycle)
	var quietRun time.Duration // the slowest Run before the storm: the machine's own figure
	for i := range bound {
		start := time.Now()
		run(t, lc, actor(i), refs[i])
		quietRun = max(quietRun, time.Since(start))
	}
	dial := func() *grpc.ClientConn {
		cc, err := grpc.NewClient("unix://"+d.Stats, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	// quiet reads once on a fresh connection, retrying a refusal after
	// 50 ms, until by; it returns the answer's samples and when it came.
	quiet := func(by time.Time) (int, time.Time, error) {
		cc := dial()
		defer cc.Close()
		c := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
		for {
			ctx, cancel := context.WithDeadline(context.Background(), by)
			resp, err := c.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			cancel()
			if err == nil || status.Code(err) != codes.ResourceExhausted || time.Now().Add(50*time.Millisecond).After(by) {
				return len(resp.GetSamples()), time.Now(), err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n, _, err := quiet(time.Now().Add(10 * time.Second)); err != nil || n != bound {
		t.Fatalf("before the storm: %d samples (%v), want %d", n, err, bound)
	}
	_, hwmBefore := procMemory(t, d.Cmd.Process.Pid)

	// The storm runs in a process of its own, as a hostile reader does:
	// the launcher's calls below share no runtime with it.
	storm := exec.Command(os.Args[0], "-test.run=^TestDiscoveryStormChild$", "-test.count=1")
	storm.Env = append(os.Environ(), stormSocketEnv+"="+d.Stats, stormForEnv+"="+stormFor.String())
	var stormOut strings.Builder
	storm.Stdout, storm.Stderr = &stormOut, &stormOut
	if err := storm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = storm.Process.Kill() })
	stormStart := time.Now()
	// The launcher meanwhile: a Run of a new actor every second.
	var lifeTook []time.Duration
	for i := range lifeTries {
		time.Sleep(time.Until(stormStart.Add(time.Duration(i+1) * stormFor / (lifeTries + 1))))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Sandbox: refs[bound+i],
			Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: actor(bound + i), TemplateNamespace: "tmpl", TemplateName: "py"}})
		took := time.Since(start)
		cancel()
		lifeTook = append(lifeTook, took.Round(time.Millisecond))
		if err != nil {
			t.Errorf("RunWorkload %s during the storm: %v (after %v)", actor(bound+i), err, took)
		}
	}
	// The storm ends: the process exits, its connections closed.
	stormErr := storm.Wait()
	stormEnd := time.Now()
	n, servedAt, quietErr := quiet(stormEnd.Add(quietBound))
	_, hwm := procMemory(t, d.Cmd.Process.Pid)

	_, counts, _ := strings.Cut(stormOut.String(), stormCountsPrefix)
	counts, _, _ = strings.Cut(counts, "\n")
	t.Logf("storm of %d x %d streams for %v against %d bindings: %s (%v)", stormConns, stormStreams, stormFor, bound, counts, stormErr)
	t.Logf("RunWorkload during the storm took %v (the slowest of the %d before it: %v)", lifeTook, bound, quietRun.Round(time.Millisecond))
	t.Logf("statsd VmHWM %.1f MiB before the storm, %.1f MiB after; quiet reader: %d samples %v after the storm's end (%v)",
		float64(hwmBefore)/(1<<20), float64(hwm)/(1<<20), n, servedAt.Sub(stormEnd).Round(time.Millisecond), quietErr)
	for i, took := range lifeTook {
		if took > lifeBound {
			t.Errorf("RunWorkload %d during the storm took %v, want within %v", i, took, lifeBound)
		}
	}
	if hwm > memoryBound {
		t.Errorf("statsd's peak memory (VmHWM) %.1f MiB, want under %d MiB", float64(hwm)/(1<<20), memoryBound>>20)
	}
	if quietErr != nil || n != bound+lifeTries {
		t.Errorf("quiet reader within %v of the storm's end: %d samples (%v), want %d", quietBound, n, quietErr, bound+lifeTries)
	}
	if stormErr != nil || !strings.Contains(stormOut.String(), stormCountsPrefix) {
		t.Errorf("the storm process: %v\n%s", stormErr, stormOut.String())
	} else if !strings.Contains(counts, " 0 other errors") {
		t.Errorf("storm calls failed otherwise than refused or late: %s", counts)
	}
}

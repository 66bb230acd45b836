package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// smapsRollup reads the Pss and Anonymous of pid (kB in the file), in bytes.
func smapsRollup(t testing.TB, pid int) (pss, anon uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Pss:":
			pss = v << 10
		case "Anonymous:":
			anon = v << 10
		}
	}
	return pss, anon
}

// contextSwitches is the sum of every thread's context switches of pid.
func contextSwitches(t testing.TB, pid int) uint64 {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var n uint64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that exited
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// TestIntegrationSeveralWorkloadsMemory measures, in one run, what serving
// 32 workloads costs the node: one statsd bound to 32 real cgroups against
// 32 statsd bound to one each, after 20 polls of every workload. The one
// daemon's Pss must be at most a tenth of the 32 daemons' together. Then,
// with the drift check off, the one daemon must make no context switch in
// 20 s of quiet: a daemon beside every sandbox costs nothing while nobody
// asks.
func TestIntegrationSeveralWorkloadsMemory(t *testing.T) {
	needCgroups(t)
	const n = 32
	bin := testenv.BuildBinaries(t)
	pod := fmt.Sprintf("sbs-several-mem-%d", os.Getpid())
	testCgroup(t, pod)
	var refs []*sandboxstatsv1.SandboxRef
	for i := range n {
		leaf := filepath.Join(pod, fmt.Sprintf("actor-%02d-_pause", i))
		testCgroup(t, leaf)
		refs = append(refs, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/" + leaf})
	}
	actor := func(i int) string { return fmt.Sprintf("actor-%02d", i) }
	args := []string{"--drift-interval", "0"}

	// The test closes its connections before the quiet part.
	var conns []*grpc.ClientConn
	dial := func(sock string) *grpc.ClientConn {
		cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, cc)
		return cc
	}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	one := testenv.StartStatsd(t, bin, append(args, "--max-workloads", strconv.Itoa(n))...)
	oneStats := sandboxstatsv1.NewWorkloadStatsServiceClient(dial(one.Stats))
	oneLife := sandboxstatsv1.NewWorkloadLifecycleServiceClient(dial(one.Lifecycle))
	singles := make([]*testenv.Statsd, n)
	singleStats := make([]sandboxstatsv1.WorkloadStatsServiceClient, n)
	for i := range n {
		singles[i] = testenv.StartStatsd(t, bin, args...)
		singleStats[i] = sandboxstatsv1.NewWorkloadStatsServiceClient(dial(singles[i].Stats))
		run(t, sandboxstatsv1.NewWorkloadLifecycleServiceClient(dial(singles[i].Lifecycle)), actor(i), refs[i])
		run(t, oneLife, actor(i), refs[i])
	}

	poll := func(c sandboxstatsv1.WorkloadStatsServiceClient, a string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: a})
		if err != nil {
			t.Errorf("StatsWorkload %s: %v", a, err)
			return
		}
		if resp.GetSample().GetActorUid() != a {
			t.Errorf("asked %s, answered %s", a, resp.GetSample().GetActorUid())
		}
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for range 20 {
				poll(singleStats[i], actor(i))
				poll(oneStats, actor(i))
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	active, err := oneStats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || len(active.GetSamples()) != n {
		t.Fatalf("discovery read of the one statsd: %d samples, %d pending, %v", len(active.GetSamples()), len(active.GetPending()), err)
	}

	var singlesPss, singlesAnon uint64
	for _, d := range singles {
		pss, anon := smapsRollup(t, d.Cmd.Process.Pid)
		singlesPss += pss
		singlesAnon += anon
	}
	onePss, oneAnon := smapsRollup(t, one.Cmd.Process.Pid)
	ratio := float64(onePss) / float64(singlesPss)
	t.Logf("Pss: one statsd serving %d workloads %.1f MiB (anonymous %.1f MiB); %d statsd serving one each %.1f MiB together, %.2f MiB each (anonymous %.1f MiB together); ratio %.3f (goal <= 0.1)",
		n, float64(onePss)/mib, float64(oneAnon)/mib, n, float64(singlesPss)/mib, float64(singlesPss)/mib/n, float64(singlesAnon)/mib, ratio)
	if ratio > 0.1 {
		t.Errorf("one statsd serving %d workloads costs %.3f of %d single-workload statsd, over a tenth", n, ratio, n)
	}

	// Quiet: the connections closed, the drift check off.
	for _, d := range singles {
		d.Stop(t)
	}
	for _, cc := range conns {
		cc.Close()
	}
	conns = nil
	pid := one.Cmd.Process.Pid
	// What the last poll left settles, and --release-after (5 s) gives the
	// burst back once.
	time.Sleep(8 * time.Second)
	before := contextSwitches(t, pid)
	time.Sleep(20 * time.Second)
	after := contextSwitches(t, pid)
	t.Logf("idle with %d bindings, drift check off: %d context switches in 20 s", n, after-before)
	if after != before {
		t.Errorf("%d context switches in 20 s of quiet with %d bindings, want 0", after-before, n)
	}
}

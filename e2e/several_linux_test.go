package e2e

// The end-to-end proofs of several workloads bound to one statsd: each
// actor on its own real cgroup in upstream's layout and answered from it
// only, a hung guest beside them costing them nothing, the churn of
// activations across the actors of one statsd charged right through
// statsagent, and the kill loop with a call of every actor in flight.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// podLeaves makes the pod cgroup /several-<pid>-<pod> and under it each
// actor's leaf, named as upstream names a sandbox's (<actor uid>-_pause),
// and returns the leaves by actor. They are removed at the end of the test,
// the leaves before the pod: make them before starting the workloads.
func podLeaves(t *testing.T, pod string, actors ...string) map[string]string {
	t.Helper()
	p := fmt.Sprintf("/several-%d-%s", os.Getpid(), pod)
	testCgroup(t, p)
	if testenv.CgroupV2() {
		// A v2 leaf has the controllers its parent passes on.
		if err := os.WriteFile(filepath.Join(testenv.CgroupRoot, p, "cgroup.subtree_control"), []byte("+memory +cpu"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	leaves := make(map[string]string, len(actors))
	for _, a := range actors {
		leaves[a] = p + "/" + a + "-_pause"
		testCgroup(t, leaves[a])
	}
	return leaves
}

// cgroupRef is the gVisor sandbox bound by its cgroup path.
func cgroupRef(cg string) *sandboxstatsv1.SandboxRef {
	return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg}
}

// kernelFigures are a cgroup's figures as its own files say them: the
// memory charged (v1 memory.usage_in_bytes, v2 memory.current), its peak (v1
// memory.max_usage_in_bytes, v2 memory.peak), the working set (the charge
// less the inactive file pages) and the CPU in usec (cgroupCPUUsec).
type kernelFigures struct {
	current, peak, workingSet, cpuUsec uint64
}

func readKernel(t *testing.T, rel string) kernelFigures {
	t.Helper()
	var k kernelFigures
	var inactive uint64
	if testenv.CgroupV2() {
		dir := filepath.Join(testenv.CgroupRoot, rel)
		k.current = testenv.CgroupUint(t, dir, "memory.current", "")
		k.peak = testenv.CgroupUint(t, dir, "memory.peak", "")
		inactive = testenv.CgroupUint(t, dir, "memory.stat", "inactive_file")
	} else {
		dir := filepath.Join(testenv.CgroupRoot, "memory", rel)
		k.current = testenv.CgroupUint(t, dir, "memory.usage_in_bytes", "")
		k.peak = testenv.CgroupUint(t, dir, "memory.max_usage_in_bytes", "")
		inactive = testenv.CgroupUint(t, dir, "memory.stat", "total_inactive_file")
	}
	k.workingSet = k.current - min(k.current, inactive)
	k.cpuUsec = cgroupCPUUsec(t, rel)
	return k
}

// readKernels reads every actor's cgroup.
func readKernels(t *testing.T, leaves map[string]string) map[string]kernelFigures {
	t.Helper()
	out := make(map[string]kernelFigures, len(leaves))
	for a, cg := range leaves {
		out[a] = readKernel(t, cg)
	}
	return out
}

// memSlack is how far the memory charged and the working set, which move
// both ways, may stray from the kernel's reads around a sample: the Go
// runtime of an idle workload still returns or takes a page now and then.
// The actors' workloads hold 16 MiB apart.
const memSlack = 256 << 10

// offKernel lists how sample s strays from the kernel figures k0 and k1,
// read right before and right after the call that answered it: the peak
// and the CPU, which only rise, lie within the two reads; the memory
// charged and the working set within memSlack of them. Nothing listed: s
// is that cgroup's.
func offKernel(s *sandboxstatsv1.WorkloadStatsSample, k0, k1 kernelFigures) []string {
	current, wset := s.GetMemoryCurrentBytes(), s.GetMemoryWorkingSetBytes()
	var off []string
	for _, f := range []struct {
		name          string
		got           *uint64
		lo, hi, slack uint64
	}{
		{"memory current", &current, k0.current, k1.current, memSlack},
		{"memory peak", s.MemoryPeakBytes, k0.peak, k1.peak, 0},
		{"working set", &wset, k0.workingSet, k1.workingSet, memSlack},
		{"cpu usec", s.CpuUsageUsec, k0.cpuUsec, k1.cpuUsec, 0},
	} {
		switch {
		case f.got == nil:
			off = append(off, f.name+" absent")
		case *f.got+f.slack < min(f.lo, f.hi) || *f.got > max(f.lo, f.hi)+f.slack:
			off = append(off, fmt.Sprintf("%s %d, the kernel's %d..%d", f.name, *f.got, f.lo, f.hi))
		}
	}
	return off
}

// checkOwn holds the sample statsd answered (in what) for actor to the
// actor's own cgroup, read right before (k0) and after (k1), and to no other
// actor's, and logs the figures beside the kernel's.
func checkOwn(t *testing.T, what, actor string, s *sandboxstatsv1.WorkloadStatsSample, leaves map[string]string, k0, k1 map[string]kernelFigures) {
	t.Helper()
	if s.GetActorUid() != actor {
		t.Errorf("%s for %s answered for %q", what, actor, s.GetActorUid())
		return
	}
	if s.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP || !strings.Contains(s.GetSourceDetail(), leaves[actor]) {
		t.Errorf("%s of %s: source %v %q, want the cgroup %s", what, actor, s.GetSource(), s.GetSourceDetail(), leaves[actor])
	}
	if p := s.SandboxProcesses; p == nil || *p != 1 {
		t.Errorf("%s of %s: sandbox processes %v, want its one workload", what, actor, p)
	}
	if off := offKernel(s, k0[actor], k1[actor]); len(off) > 0 {
		t.Errorf("%s of %s is not its own cgroup's: %s", what, actor, strings.Join(off, "; "))
	}
	for other := range leaves {
		if other != actor && len(offKernel(s, k0[other], k1[other])) == 0 {
			t.Errorf("%s of %s equals %s's cgroup", what, actor, other)
		}
	}
	k := k1[actor]
	t.Logf("%s %s: memory %d B (kernel %d), peak %d B (kernel %d), working set %d B (kernel %d), CPU %d us (kernel %d)", what, actor,
		s.GetMemoryCurrentBytes(), k.current, s.GetMemoryPeakBytes(), k.peak, s.GetMemoryWorkingSetBytes(), k.workingSet, s.GetCpuUsageUsec(), k.cpuUsec)
}

// sampleActors lists the actors of the samples, in their order.
func sampleActors(samples []*sandboxstatsv1.WorkloadStatsSample) []string {
	var out []string
	for _, s := range samples {
		out = append(out, s.GetActorUid())
	}
	return out
}

// TestIntegrationSeveralWorkloads: four actors bound to one statsd by
// --cgroup-path, each to its own leaf under one pod cgroup, each leaf
// holding a workload that burnt a known CPU (0.5 to 2 s) and holds a known
// memory (16 to 64 MiB, touched). Each actor's StatsWorkload sample, and
// its sample in the one StatsActiveWorkloads answer, is its own cgroup's
// figures as the kernel's files say them (read right before and after:
// the CPU and the peak within the two reads, to the usec and the byte; the
// memory within 256 KiB), and no other actor's.
func TestIntegrationSeveralWorkloads(t *testing.T) {
	needCgroups(t)
	bin := testenv.BuildBinaries(t)
	work := []struct {
		actor            string
		burnMS, allocMiB int
	}{
		{"actor-a", 500, 16},
		{"actor-b", 1000, 32},
		{"actor-c", 1500, 48},
		{"actor-d", 2000, 64},
	}
	var actors []string
	for _, w := range work {
		actors = append(actors, w.actor)
	}
	leaves := podLeaves(t, "four", actors...)
	d := testenv.StartStatsd(t, bin)
	stats, life := clients(t, d)
	for _, a := range actors {
		run(t, life, a, cgroupRef(leaves[a]))
	}
	// The four workloads at once, each in its own leaf, idle afterwards.
	children := make([]*testenv.Child, len(work))
	for i, w := range work {
		children[i] = testenv.StartChild(t, "TestWorkloadChild")
		moveTo(t, leaves[w.actor], children[i].Cmd.Process.Pid)
		children[i].Send(t, fmt.Sprintf("alloc %d", w.allocMiB))
		children[i].Send(t, fmt.Sprintf("burn %d", w.burnMS))
	}
	for i, w := range work {
		children[i].Answer(t, "alloc")
		children[i].Answer(t, "burn")
		// The workload is where the test put it.
		if k := readKernel(t, leaves[w.actor]); k.current < uint64(w.allocMiB)<<20 || k.cpuUsec < uint64(w.burnMS)*1000 {
			t.Fatalf("%s's cgroup %s: %+v, want at least %d MiB and %d ms", w.actor, leaves[w.actor], k, w.allocMiB, w.burnMS)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range actors {
		k0 := readKernels(t, leaves)
		r, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: a})
		k1 := readKernels(t, leaves)
		if err != nil {
			t.Fatalf("StatsWorkload %s: %v", a, err)
		}
		checkOwn(t, "StatsWorkload", a, r.GetSample(), leaves, k0, k1)
	}
	k0 := readKernels(t, leaves)
	resp, err := stats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	k1 := readKernels(t, leaves)
	if err != nil {
		t.Fatalf("StatsActiveWorkloads: %v", err)
	}
	if diff := cmp.Diff(actors, sampleActors(resp.GetSamples())); diff != "" {
		t.Fatalf("StatsActiveWorkloads samples, by actor (-want +got):\n%s\npending: %v", diff, resp.GetPending())
	}
	if len(resp.GetPending()) > 0 {
		t.Errorf("StatsActiveWorkloads pending %v, want none", resp.GetPending())
	}
	for _, s := range resp.GetSamples() {
		checkOwn(t, "StatsActiveWorkloads", s.GetActorUid(), s, leaves, k0, k1)
	}
}

// latency is how fast StatsWorkload answers: the median of every call, the
// largest of each window of calls, and the least of those (a window
// without the machine's odd hiccup: a slowdown the hung neighbour causes
// is in every window, a hiccup of the machine in one).
type latency struct {
	p50, max, leastMax time.Duration
}

func (l latency) String() string {
	return fmt.Sprintf("p50 %v, max %v (least of a window %v)", l.p50, l.max, l.leastMax)
}

// measureLatency times windows of rounds of StatsWorkload of each actor,
// one call at a time.
func measureLatency(t *testing.T, stats sandboxstatsv1.WorkloadStatsServiceClient, actors []string, windows, rounds int) latency {
	t.Helper()
	var all []time.Duration
	l := latency{leastMax: time.Hour}
	for range windows {
		var most time.Duration
		for range rounds {
			for _, a := range actors {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				_, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: a})
				took := time.Since(start)
				cancel()
				if err != nil {
					t.Fatalf("StatsWorkload %s: %v", a, err)
				}
				all = append(all, took)
				most = max(most, took)
			}
		}
		l.max, l.leastMax = max(l.max, most), min(l.leastMax, most)
	}
	slices.Sort(all)
	l.p50 = all[len(all)/2]
	return l
}

// TestIntegrationSeveralWorkloadsHungAgent: one statsd, three actors on
// real cgroups and one micro-VM whose guest agent hangs (answers no
// StatsContainer, whatever the deadline). While four keyed reads and a
// discovery read of the hung guest wait out the read timeout, the other
// actors' StatsWorkload answer as fast as before: the median, and the
// largest call of the best of three windows, at most twice before's or
// 50 ms (statsd and the test favored while timed). A StatsActiveWorkloads
// with a 1 s deadline answers before it with the three samples, each its
// own cgroup's, and the guest pending READ_TIMEOUT; each hung keyed read
// answers DEADLINE_EXCEEDED READ_TIMEOUT by the read timeout.
func TestIntegrationSeveralWorkloadsHungAgent(t *testing.T) {
	needCgroups(t)
	bin := testenv.BuildBinaries(t)
	actors := []string{"actor-a", "actor-b", "actor-c"}
	const vm = "actor-vm"
	leaves := podLeaves(t, "hung", actors...)
	for i, a := range actors {
		c := testenv.StartChild(t, "TestWorkloadChild")
		moveTo(t, leaves[a], c.Cmd.Process.Pid)
		c.Do(t, fmt.Sprintf("alloc %d", 16*(i+1)))
	}
	agent := kataagentfake.New(t, t.TempDir(),
		kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 5_000_000_000})))
	const readTimeout = 2 * time.Second // StartStatsdAt's --read-timeout
	d := testenv.StartStatsd(t, bin)
	stats, life := clients(t, d)
	for _, a := range actors {
		run(t, life, a, cgroupRef(leaves[a]))
	}
	run(t, life, vm, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
		AgentAddress: agent.Address(), ContainerIds: []string{"web"}})
	waitFor(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: vm})
		return err == nil
	}, "the guest agent to answer before it hangs")

	// Both ends of the calls favored (nice -20) while they are timed: the
	// latencies are statsd's, not the waits the machine's other tenants
	// impose.
	unfavorStatsd, unfavorSelf := testenv.FavorProcess(t, d.Cmd.Process.Pid), testenv.FavorProcess(t, os.Getpid())
	unfavor := sync.OnceFunc(func() { unfavorSelf(); unfavorStatsd() })
	defer unfavor()
	const windows, rounds = 3, 30
	measureLatency(t, stats, actors, 1, 5) // warm
	before := measureLatency(t, stats, actors, windows, rounds)

	agent.SetStatsHang(true)
	_, _, asked, _ := agent.Counts()
	type hungAnswer struct {
		code   codes.Code
		reason string
		took   time.Duration
	}
	show := func(hs []hungAnswer) string {
		var out []string
		for _, h := range hs {
			out = append(out, fmt.Sprintf("%v %s after %v", h.code, h.reason, h.took.Round(time.Millisecond)))
		}
		return strings.Join(out, ", ")
	}
	var (
		mu      sync.Mutex
		keyed   []hungAnswer
		pending []string // the guest's pending reason in each deadline-less discovery read
		wg      sync.WaitGroup
	)
	hctx, stop := context.WithCancel(context.Background())
	for range 4 {
		wg.Go(func() {
			for hctx.Err() == nil {
				start := time.Now()
				_, err := stats.StatsWorkload(hctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: vm})
				if hctx.Err() != nil {
					return
				}
				mu.Lock()
				keyed = append(keyed, hungAnswer{status.Code(err), api.ReasonOf(err), time.Since(start)})
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for hctx.Err() == nil {
			r, err := stats.StatsActiveWorkloads(hctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			if hctx.Err() != nil {
				return
			}
			mu.Lock()
			if err != nil {
				pending = append(pending, err.Error())
			}
			for _, p := range r.GetPending() {
				pending = append(pending, p.GetIdentity().GetActorUid()+" "+p.GetReason().String())
			}
			mu.Unlock()
		}
	})
	defer func() { stop(); wg.Wait() }()
	waitFor(t, 5*time.Second, func() bool { _, _, n, _ := agent.Counts(); return n > asked }, "a read of the hung guest")
	hung := time.Now()
	during := measureLatency(t, stats, actors, windows, rounds)
	window := time.Since(hung)
	unfavor()

	const floor = 50 * time.Millisecond
	t.Logf("StatsWorkload of the three others, %d windows of %d calls each: before the hang %v; during it (%v, the guest's reads in flight) %v",
		windows, rounds*len(actors), before, window.Round(time.Millisecond), during)
	if during.p50 > max(2*before.p50, floor) || during.leastMax > max(2*before.leastMax, floor) {
		t.Errorf("a hung neighbour slowed the others: before %v, during %v (want p50 and a window's max at most twice before's, or %v)", before, during, floor)
	}

	// The discovery read with a deadline answers before it.
	const deadline = time.Second
	k0 := readKernels(t, leaves)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	resp, err := stats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	took := time.Since(start)
	cancel()
	k1 := readKernels(t, leaves)
	if err != nil {
		t.Fatalf("StatsActiveWorkloads with a %v deadline and a hung guest: %v after %v", deadline, err, took)
	}
	var gotPending, details []string
	for _, p := range resp.GetPending() {
		gotPending = append(gotPending, fmt.Sprintf("%s %v %v", p.GetIdentity().GetActorUid(), p.GetSandboxClass(), p.GetReason()))
		details = append(details, p.GetDetail())
	}
	t.Logf("StatsActiveWorkloads with a %v deadline answered in %v: samples %v, pending %v %q", deadline, took.Round(time.Millisecond),
		sampleActors(resp.GetSamples()), gotPending, details)
	if took >= deadline {
		t.Errorf("StatsActiveWorkloads took %v, past the caller's %v deadline", took, deadline)
	}
	if diff := cmp.Diff(actors, sampleActors(resp.GetSamples())); diff != "" {
		t.Errorf("samples beside a hung guest, by actor (-want +got):\n%s", diff)
	}
	for _, s := range resp.GetSamples() {
		checkOwn(t, "StatsActiveWorkloads", s.GetActorUid(), s, leaves, k0, k1)
	}
	want := []string{vm + " SANDBOX_CLASS_MICROVM ERROR_REASON_READ_TIMEOUT"}
	if diff := cmp.Diff(want, gotPending); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}

	// The hung guest's own reads: each answers by the read timeout (the
	// reads of one guest share its one StatsContainer call in flight).
	waitFor(t, readTimeout+5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(keyed) >= 4 && len(pending) >= 1
	}, "the reads of the hung guest to answer")
	stop()
	wg.Wait()
	_, _, n, _ := agent.Counts()
	t.Logf("the hung guest was asked %d times (at most %d at once); %d keyed reads of it answered: %v; discovery reads without a deadline listed it: %v",
		n-asked, agent.MaxConcurrentStats(), len(keyed), show(keyed), pending)
	if len(keyed) == 0 {
		t.Error("no keyed read of the hung guest answered")
	}
	for _, h := range keyed {
		if h.code != codes.DeadlineExceeded || h.reason != api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT) || h.took > readTimeout+time.Second {
			t.Errorf("a keyed read of the hung guest answered %v %s after %v, want DeadlineExceeded READ_TIMEOUT by the %v read timeout", h.code, h.reason, h.took, readTimeout)
		}
	}
	for _, p := range pending {
		if p != vm+" ERROR_REASON_READ_TIMEOUT" {
			t.Errorf("a discovery read without a deadline: %s, want %s pending READ_TIMEOUT", p, vm)
		}
	}
}

// leafActivation runs one activation of actor in its leaf cgroup cg of
// the statsd behind lc, the leaf made afresh (a new sandbox of the same
// name, its counters from 0): Run, a workload child burning CPU for a
// quarter of lifetime (four lanes share two CPUs), the cgroup's own CPU
// once the workload idles, Checkpoint, the child killed and the leaf
// removed. It returns that CPU, in usec.
func leafActivation(t *testing.T, lc sandboxstatsv1.WorkloadLifecycleServiceClient, actor, cg string, lifetime time.Duration) uint64 {
	t.Helper()
	for _, dir := range cgroupDirs(cg) {
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	w := testenv.StartChild(t, "TestWorkloadChild")
	start := time.Now()
	run(t, lc, actor, cgroupRef(cg))
	moveTo(t, cg, w.Cmd.Process.Pid)
	w.Do(t, fmt.Sprintf("burn %d", lifetime.Milliseconds()/4))
	if rest := lifetime - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
	truth := cgroupCPUUsec(t, cg)
	e := checkpoint(t, lc, actor)
	lived := time.Since(start)
	w.Kill()
	for _, dir := range cgroupDirs(cg) {
		if err := testenv.RmdirRetry(dir); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: lived %v (%.2f intervals), cgroup CPU %d us, record %d us (%s)", actor, lived.Round(time.Millisecond),
		float64(lived)/float64(churnInterval), truth, e.GetCpuUsec(), e.GetFinalProvenance())
	return truth
}

// byActor sums the series of metric (named as testenv.Scrape keys them)
// from the cgroup source by their actor_uid label.
func byActor(m map[string]float64, metric string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		labels, ok := strings.CutPrefix(k, metric+"{")
		if !ok || !strings.Contains(labels, "source=cgroup") {
			continue
		}
		for l := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
			if uid, ok := strings.CutPrefix(l, "actor_uid="); ok {
				out[uid] += v
			}
		}
	}
	return out
}

// TestIntegrationSeveralWorkloadsChurn: the churn of activations across
// four actors of one statsd, polled by the statsagent binary (per actor,
// --label-actor) every second and scraped by a real Prometheus. Each actor
// runs activations of 0.25 to 2.5 intervals one after another in its leaf
// of one pod cgroup (made afresh for each), burning real CPU; the four
// actors' Runs and Checkpoints interleave. The CPU the agent exports for
// each actor equals the sum of its own cgroups' counters at each end within
// 1% (the heads before a first poll and the tails after the last included),
// so does the total (in the agent and in Prometheus) and the activation
// histogram's _sum, and every activation has exactly one record, read at
// its end.
func TestIntegrationSeveralWorkloadsChurn(t *testing.T) {
	needCgroups(t)
	c := startChurn(t, "--label-actor")
	d := startStatsdIn(t, c.bin, c.dir, "four")
	lanes := []struct {
		actor     string
		intervals []float64
	}{
		{"actor-a", []float64{0.25, 2, 0.5}},
		{"actor-b", []float64{1.5, 0.3, 1}},
		{"actor-c", []float64{0.75, 2.5}},
		{"actor-d", []float64{1, 0.4, 0.6, 0.8}},
	}
	var actors []string
	for _, l := range lanes {
		actors = append(actors, l.actor)
	}
	leaves := podLeaves(t, "churn", actors...)
	var (
		mu    sync.Mutex
		truth = map[string]uint64{} // actor -> its cgroups' own CPU at each end, summed, usec
		acts  = map[string]int{}
	)
	// The four lanes at once (subtests run from goroutines, not gated by
	// -parallel).
	var wg sync.WaitGroup
	for _, l := range lanes {
		wg.Go(func() {
			t.Run(l.actor, func(t *testing.T) {
				lc := lifecycleClient(t, d.Lifecycle)
				for _, n := range l.intervals {
					u := leafActivation(t, lc, l.actor, leaves[l.actor], time.Duration(n*float64(churnInterval)))
					mu.Lock()
					truth[l.actor] += u
					acts[l.actor]++
					mu.Unlock()
				}
			})
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	testenv.WaitNewSweeps(t, c.agentURL)      // the last ends seen ...
	m := testenv.WaitNewSweeps(t, c.agentURL) // ... and charged
	exported := byActor(m, "sandboxstats_workload_cpu_seconds_total")
	var sumTruth, sumExported, hist float64
	for k, v := range m {
		if strings.HasPrefix(k, "sandboxstats_activation_cpu_seconds_sum{") && strings.Contains(k, "source=cgroup") {
			hist += v
		}
	}
	for _, a := range actors {
		tr := float64(truth[a]) / 1e6
		sumTruth += tr
		sumExported += exported[a]
		t.Logf("%s: %d activations, its cgroups used %.3f CPU-s; statsagent exported %.3f (%.4f of it)", a, acts[a], tr, exported[a], exported[a]/tr)
		if !within(exported[a], tr, 0.01) {
			t.Errorf("%s: exported CPU %.3f s, its cgroups' own %.3f s: off by more than 1%%", a, exported[a], tr)
		}
	}
	t.Logf("all four: cgroups used %.3f CPU-s; statsagent exported %.3f (%.4f), activation histogram _sum %.3f (%.4f); today's rules (before activation accounting) %.3f (%.3f)",
		sumTruth, sumExported, sumExported/sumTruth, hist, hist/sumTruth, c.legacy.total(), c.legacy.total()/sumTruth)
	if !within(sumExported, sumTruth, 0.01) || !within(hist, sumTruth, 0.01) {
		t.Errorf("exported %.3f s and histogram _sum %.3f s, the cgroups' own %.3f s: off by more than 1%%", sumExported, hist, sumTruth)
	}
	if len(exported) != len(actors) {
		t.Errorf("CPU exported for actors %v, want %v", exported, actors)
	}

	recs := map[string]int{}
	epochs := map[string]bool{}
	charges := map[string]int{} // how the agent charged each end: whole (never seen alive) or its tail
	for _, r := range c.recordList(t) {
		recs[r.ActorUID]++
		charges[r.Charge]++
		key := fmt.Sprintf("%s@%d", r.ActorUID, r.EpochUnixNano)
		if epochs[key] {
			t.Errorf("activation %s logged twice", key)
		}
		epochs[key] = true
		if r.FinalProvenance != "read-at-end" || r.CPUSeconds == nil {
			t.Errorf("record %+v, want its CPU read at its end", r)
		}
	}
	if diff := cmp.Diff(acts, recs); diff != "" {
		t.Errorf("activation records by actor (-want +got):\n%s", diff)
	}
	t.Logf("activation records by actor %v, charged at the end %v", recs, charges)

	if c.prom == nil {
		t.Log("no Prometheus in the VM lane's guest: the host's run of this test checks it")
		return
	}
	time.Sleep(1500 * time.Millisecond) // at least two scrapes after the agent's last sweep
	q := c.prom.Query(t, `sum by (actor_uid) (sandboxstats_workload_cpu_seconds_total{source="cgroup"})`)
	got := map[string]float64{}
	for _, s := range q {
		got[s.Labels["actor_uid"]] = s.Value
	}
	for _, a := range actors {
		if tr := float64(truth[a]) / 1e6; !within(got[a], tr, 0.01) {
			t.Errorf("prometheus: %s's CPU %.3f s, its cgroups' own %.3f s", a, got[a], tr)
		}
	}
	t.Logf("prometheus: CPU by actor %v", got)
}

// killLoopActor is one actor of the kill loop of several workloads: its
// state as acknowledged, its call in flight at the kill, and its
// acknowledged ends.
type killLoopActor struct {
	uid      string
	seq      int
	acked    boundState
	epoch    int64 // of the acknowledged binding
	inFlight *boundState
	ends     []int64 // epochs whose end (a Checkpoint) was acknowledged or found done
	err      error   // a call that failed before the kill
}

// untilKilled makes the actor's lifecycle calls back to back on its own
// connection (Run or Restore of a fresh cgroup path, Checkpoint, ...) until
// one fails, which must be after killed closed: that call is in flight.
func (l *killLoopActor) untilKilled(socket string, killed <-chan struct{}) {
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		l.err = err
		return
	}
	defer cc.Close()
	lc := sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc)
	for {
		l.seq++
		next := boundState{}
		var epoch int64
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		id := &sandboxstatsv1.WorkloadIdentity{ActorUid: l.uid}
		switch {
		case l.acked.Actor != "":
			_, err = lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: l.uid})
		case l.seq%2 == 0:
			next = boundState{Actor: l.uid, Cgroup: fmt.Sprintf("/kill-%s-%d", l.uid, l.seq), Op: "run"}
			var r *sandboxstatsv1.RunWorkloadResponse
			r, err = lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: cgroupRef(next.Cgroup)})
			epoch = r.GetEpochUnixNano()
		default:
			next = boundState{Actor: l.uid, Cgroup: fmt.Sprintf("/kill-%s-%d", l.uid, l.seq), Op: "restore"}
			var r *sandboxstatsv1.RestoreWorkloadResponse
			r, err = lc.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: id, Sandbox: cgroupRef(next.Cgroup)})
			epoch = r.GetEpochUnixNano()
		}
		cancel()
		if err != nil {
			select {
			case <-killed:
				l.inFlight = &next
			default:
				l.err = fmt.Errorf("%s: call %d before the kill: %w", l.uid, l.seq, err)
			}
			return
		}
		if next.Actor == "" {
			l.ends = append(l.ends, l.epoch)
		}
		l.acked, l.epoch = next, epoch
	}
}

// TestIntegrationKillLoopSeveralWorkloads: the kill loop with four actors
// bound at once. Each actor is a stream of its own lifecycle calls (Run,
// Checkpoint, Restore, Checkpoint, ...) on its own connection, the four at
// once, and statsd is killed with SIGKILL 50 times among them, each time
// with a call of every actor in flight. After every restart binding.json
// binds only these actors, each to the state of its own last acknowledged
// call or of its call in flight (never another's, never a torn file), every
// acknowledged end and every in-flight Checkpoint found done is in
// ended.json, and no temp or corrupt file is left.
func TestIntegrationKillLoopSeveralWorkloads(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts the statsd binary 50 times")
	}
	bin := testenv.BuildBinaries(t)
	dir := t.TempDir()
	d := testenv.StartStatsdAt(t, bin, filepath.Join(dir, "stats.sock"), filepath.Join(dir, "life.sock"), filepath.Join(dir, "state"),
		"--drift-interval", "0", "--ended-max", "100000")
	var loops []*killLoopActor
	for _, a := range []string{"actor-a", "actor-b", "actor-c", "actor-d"} {
		loops = append(loops, &killLoopActor{uid: a})
	}
	// How often an actor's call in flight was found done, how often a kill
	// left a temp file, how many restarts were checked, and the most actors
	// bound at once after a restart.
	var foundInFlight, tempsLeft, checked, mostBound int
	restartAndCheck := func(kill int) {
		t.Helper()
		if m, _ := filepath.Glob(filepath.Join(d.StateDir, "*.tmp-*")); len(m) > 0 {
			tempsLeft++
		}
		restart(t, d)
		states, epochs, ended := readStateFiles(t, d.StateDir)
		mostBound = max(mostBound, len(states))
		for a := range states {
			if !slices.ContainsFunc(loops, func(l *killLoopActor) bool { return l.uid == a }) {
				t.Fatalf("restart after kill %d: binding.json binds %q, no actor of the loop", kill, a)
			}
		}
		for _, l := range loops {
			got := states[l.uid] // cleared when absent
			switch {
			case got == l.acked:
			case l.inFlight != nil && got == *l.inFlight:
				// The call in flight was done after all.
				foundInFlight++
				if got.Actor == "" {
					l.ends = append(l.ends, l.epoch)
				}
				l.acked, l.epoch = got, epochs[l.uid]
			default:
				want := l.acked.String()
				if l.inFlight != nil {
					want += " or " + l.inFlight.String()
				}
				t.Fatalf("restart after kill %d: binding.json holds %s for %s, want %s", kill, got, l.uid, want)
			}
			for _, e := range l.ends {
				if !ended[e] {
					t.Fatalf("restart after kill %d: the end of %s's epoch %d is not in ended.json", kill, l.uid, e)
				}
			}
		}
		noLeftovers(t, d.StateDir, kill)
		checked++
	}
	const kills = 50
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	for kill := range kills {
		if kill > 0 {
			restartAndCheck(kill)
		}
		killAt := time.Now().Add(time.Duration(5+rng.IntN(40)) * time.Millisecond)
		killed := make(chan struct{}) // closed just before the kill
		go func() {
			time.Sleep(time.Until(killAt))
			close(killed)
			d.Cmd.Process.Kill()
		}()
		var wg sync.WaitGroup
		for _, l := range loops {
			l.inFlight = nil
			wg.Go(func() { l.untilKilled(d.Lifecycle, killed) })
		}
		wg.Wait()
		<-killed
		d.Cmd.Wait()
		for _, l := range loops {
			if l.err != nil {
				t.Fatal(l.err)
			}
		}
	}
	restartAndCheck(kills)
	if checked != kills {
		t.Fatalf("%d restarts checked after %d kills", checked, kills)
	}
	calls, ends := 0, 0
	for _, l := range loops {
		calls += l.seq
		ends += len(l.ends)
	}
	fi, err := os.Stat(filepath.Join(d.StateDir, "ended.json"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: %d SIGKILLs among %d lifecycle calls of %d actors (each with a call in flight at every kill); all %d restarts found each actor's acknowledged or in-flight state "+
		"(an in-flight one %d times), at most %d bound at once; %d kills left a temp file, all swept; %d ends all kept (ended.json %d bytes)",
		kills, calls, len(loops), checked, foundInFlight, mostBound, tempsLeft, ends, fi.Size())
	if logs, _ := os.ReadFile(d.Log); strings.Contains(string(logs), "unreadable") {
		t.Errorf("a state file was found unreadable:\n%s", logs)
	}
}

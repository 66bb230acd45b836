package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationHostileSentry: the statsd binary with --runsc-root over a
// runsc root the test writes (state files of runsc 20221219's shape, seven
// sandboxes of two containers each, each bound by its real v1 cgroup's
// path), whose control servers are fakes on runsc's socket-file layout:
// one hangs (accepts, never answers), one is slow (a byte every 50 ms), one
// floods (bytes without end past the 64 KiB cap), one answers garbage that
// starts with a terminal escape sequence, one lies about the container
// (the event of another sandbox's), one lies about the keys (the CPU of
// another sandbox's containers), and one is a healthy neighbour.
//
//   - Each hostile workload's StatsWorkload answers, within the sentry's
//     bound (gvisor.DefaultSentryTimeout) plus slack, a sample with its
//     cgroup's figures and no container, "containers" absent with a reason
//     naming the failure (and the socket, but for a read that outlived the
//     bound), escaped (no raw ESC in any answer or log line) and cut; the
//     liar about keys gets its containers from the state files, their CPU
//     absent, never the other sandbox's figures.
//   - The healthy neighbour's StatsWorkload answers as fast while the six
//     hostile ones are read in a loop (each once per 10 ms at most) as
//     before (the hung-neighbour test's bound: p50 and the least window's
//     max at most twice before's, or 50 ms), and its containers are there,
//     named, their CPU within the sandbox's.
//   - After the hostile reads statsd's goroutines and anonymous memory are back where
//     they were (goroutines within 10% + 5, anonymous memory within 10% of the RSS + 4 MiB), its peak
//     RSS under the hostile tests' 64 MiB.
//   - Every request any fake received is containerManager.Event with null
//     or the sandbox id (the fakes fail the test otherwise).
func TestIntegrationHostileSentry(t *testing.T) {
	needV1(t)
	bin := testenv.BuildBinaries(t)
	const good = "hs-good"
	hostile := []string{"hs-hang", "hs-slow", "hs-flood", "hs-garbage", "hs-liar", "hs-liar-keys"}
	actors := append([]string{good}, hostile...)
	leaves := podLeaves(t, "sentry", actors...)
	root := t.TempDir()

	// Each sandbox's cgroup holds a process, its "sentry" in the state
	// files; the neighbour's burns a little, so that it has CPU to share.
	for _, a := range actors {
		c := testenv.StartChild(t, "TestWorkloadChild")
		moveTo(t, leaves[a], c.Cmd.Process.Pid)
		if a == good {
			c.Do(t, "burn 200")
		}
		writeRunscSandbox(t, root, a, c.Cmd.Process.Pid, leaves[a],
			fakeRunscContainer{a + "-app", "app"}, fakeRunscContainer{a + "-side", "side"})
	}
	start := time.Now()
	goodUsage := func() map[string]uint64 {
		ns := uint64(time.Since(start).Nanoseconds())
		return map[string]uint64{good: 0, good + "-app": 10_000_000 + ns/4, good + "-side": 10_000_000 + ns/12}
	}
	sentries := map[string]*fakeSentry{
		good:         startFakeSentry(t, root, good, sentryAnswers(goodUsage)),
		"hs-hang":    startFakeSentry(t, root, "hs-hang", sentryHangs),
		"hs-flood":   startFakeSentry(t, root, "hs-flood", sentryFloods),
		"hs-garbage": startFakeSentry(t, root, "hs-garbage", sentryGarbage),
		"hs-liar":    startFakeSentry(t, root, "hs-liar", sentryLies(good, goodUsage())),
		"hs-slow":    startFakeSentry(t, root, "hs-slow", sentrySlow),
		// About the sandbox asked for, with the neighbour's containers'
		// CPU: none of it may be charged to this sandbox's containers.
		"hs-liar-keys": startFakeSentry(t, root, "hs-liar-keys", sentryLiesAboutKeys(goodUsage())),
	}
	d := testenv.StartStatsd(t, bin, "--runsc-root", root, "--drift-interval", "0")
	stats, life := clients(t, d)
	for _, a := range actors {
		run(t, life, a, cgroupRef(leaves[a]))
	}

	// Each hostile case: bounded, named, escaped, cut.
	const slack = time.Second // a loaded 2-core machine
	bound := gvisor.DefaultSentryTimeout + slack
	want := map[string]string{
		"hs-hang":    "deadline",
		"hs-slow":    "deadline",
		"hs-flood":   "reply too large",
		"hs-garbage": "malformed reply",
		"hs-liar":    "reply names another container",
	}
	var ans answers
	for _, a := range hostile {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		resp, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: a})
		took := time.Since(t0)
		cancel()
		ans.note(a, resp, err)
		if err != nil {
			t.Errorf("%s: StatsWorkload: %v after %v, want a sample", a, err, took)
			continue
		}
		if took > bound {
			t.Errorf("%s: StatsWorkload took %v, want at most %v (the sentry's bound %v and slack)", a, took, bound, gvisor.DefaultSentryTimeout)
		}
		checkHostileSample(t, a, resp.GetSample(), want[a], took)
	}
	if w := sentries["hs-flood"].written.Load(); w <= 64<<10 {
		t.Errorf("the flooding sentry wrote only %d bytes: not past the cap", w)
	}

	// The neighbour's latency, before and while the hostile ones are read.
	unfavorStatsd, unfavorSelf := testenv.FavorProcess(t, d.Cmd.Process.Pid), testenv.FavorProcess(t, os.Getpid())
	unfavor := sync.OnceFunc(func() { unfavorSelf(); unfavorStatsd() })
	defer unfavor()
	const windows, rounds = 3, 30
	measureLatency(t, stats, []string{good}, 1, 10) // warm
	time.Sleep(time.Second)
	c0 := readCounters(t, d)
	before := measureLatency(t, stats, []string{good}, windows, rounds)

	hctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	reads := map[string]int{}
	for _, a := range hostile {
		wg.Go(func() {
			// One read each 10 ms at most: far more often than any
			// poller, short of loading the machine's two cores with
			// the test's own reads.
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for ; hctx.Err() == nil; <-tick.C {
				ctx, cancel := context.WithTimeout(hctx, 10*time.Second)
				resp, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: a})
				cancel()
				if hctx.Err() != nil {
					return
				}
				ans.note(a, resp, err)
				mu.Lock()
				reads[a]++
				mu.Unlock()
				if err != nil {
					t.Errorf("%s: StatsWorkload while read in a loop: %v", a, err)
				}
				for _, c := range resp.GetSample().GetContainers() {
					if c.GetCpuUsageUsec() > 0 {
						t.Errorf("%s: StatsWorkload while read in a loop: container %s charged %d us by a hostile sentry", a, c.GetName(), c.GetCpuUsageUsec())
					}
				}
			}
		})
	}
	waitFor(t, 5*time.Second, func() bool { return sentries["hs-hang"].calls.Load() > 1 }, "a read of the hung sentry")
	t1 := time.Now()
	during := measureLatency(t, stats, []string{good}, windows, rounds)
	for time.Since(t1) < 3*time.Second {
		time.Sleep(100 * time.Millisecond) // a few hung reads at least
	}
	window := time.Since(t1)
	stop()
	wg.Wait()
	unfavor()
	const floor = 50 * time.Millisecond
	t.Logf("the neighbour's StatsWorkload, %d windows of %d calls: before %v; while the hostile ones are read (%v, reads %v) %v",
		windows, rounds, before, window.Round(time.Millisecond), reads, during)
	if during.p50 > max(2*before.p50, floor) || during.leastMax > max(2*before.leastMax, floor) {
		t.Errorf("hostile sentries slowed the neighbour: before %v, during %v (want p50 and a window's max at most twice before's, or %v)", before, during, floor)
	}

	// The neighbour's breakdown.
	resp, err := stats.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: good})
	if err != nil {
		t.Fatal(err)
	}
	s := resp.GetSample()
	var names []string
	var sum uint64
	for _, c := range s.GetContainers() {
		names = append(names, fmt.Sprintf("%s=%s", c.GetName(), c.GetId()))
		if c.CpuUsageUsec == nil {
			t.Errorf("neighbour's container %s: CPU absent: %v", c.GetName(), c.GetAbsent())
		}
		sum += c.GetCpuUsageUsec()
	}
	t.Logf("the neighbour: containers %v, their CPU %d us of the sandbox's %d us", names, sum, s.GetCpuUsageUsec())
	if got := strings.Join(names, " "); got != "app=hs-good-app side=hs-good-side" {
		t.Errorf("the neighbour's containers %q, want app and side with their runsc ids; absent %v", got, s.GetAbsent())
	}
	if sum > s.GetCpuUsageUsec() {
		t.Errorf("the neighbour's containers' CPU %d us, more than the sandbox's %d us", sum, s.GetCpuUsageUsec())
	}

	// statsd's goroutines and memory after the hostile reads.
	time.Sleep(2 * time.Second) // the hung reads' goroutines end with the sentry's bound
	c1 := readCounters(t, d)
	peak := peakRSS(t, d)
	t.Logf("statsd: goroutines %d -> %d, RSS %.1f -> %.1f MiB (peak %.1f MiB), anonymous %.1f -> %.1f MiB; sentry calls %v; answers %d, largest %d bytes",
		c0.goroutines, c1.goroutines, float64(c0.rssBytes)/(1<<20), float64(c1.rssBytes)/(1<<20), float64(peak)/(1<<20),
		float64(c0.anonBytes)/(1<<20), float64(c1.anonBytes)/(1<<20), sentryCalls(sentries), ans.n, ans.largest)
	if c1.goroutines > c0.goroutines+c0.goroutines/10+5 {
		t.Errorf("statsd's goroutines %d after the hostile reads, %d before", c1.goroutines, c0.goroutines)
	}
	if c1.anonBytes > c0.anonBytes+c0.rssBytes/10+4<<20 { // anonymous: see counters
		t.Errorf("statsd's anonymous memory %d bytes after the hostile reads, %d before (RSS %d, %d)", c1.anonBytes, c0.anonBytes, c1.rssBytes, c0.rssBytes)
	}
	if peak > maxRSSBytes {
		t.Errorf("statsd's peak RSS %d bytes, want under %d", peak, maxRSSBytes)
	}
	ans.check(t)
	checkLog(t, d.Log)
}

// checkHostileSample checks the sample of a workload whose sentry is
// hostile: its cgroup's CPU there; no container, "containers" absent with
// a reason naming what went wrong (want) and the sentry's socket, escaped
// and cut; or, for the sentry that answers the CPU of another sandbox's
// containers, the containers listed from the state files with their CPU
// absent (want the reason).
func checkHostileSample(t *testing.T, a string, s *sandboxstatsv1.WorkloadStatsSample, want string, took time.Duration) {
	t.Helper()
	if s.CpuUsageUsec == nil {
		t.Errorf("%s: the sample lost its cgroup's CPU: %v", a, s)
	}
	if a == "hs-liar-keys" {
		var got []string
		for _, c := range s.GetContainers() {
			got = append(got, c.GetName())
			// The reply names only the neighbour's containers (foreign
			// keys, dropped): none of its CPU is split to this sandbox's
			// (runsc omits a 0, so a container not named has 0).
			if c.GetCpuUsageUsec() != 0 {
				t.Errorf("%s: container %s CPU %d us, want 0: the neighbour's CPU charged", a, c.GetName(), c.GetCpuUsageUsec())
			}
		}
		t.Logf("%s: answered in %v, containers %v, none charged", a, took.Round(time.Millisecond), got)
		if strings.Join(got, " ") != "app side" {
			t.Errorf("%s: containers %v, want app and side (from the state files)", a, got)
		}
		return
	}
	reason := absentReason(s.GetAbsent(), "containers")
	t.Logf("%s: answered in %v, containers absent: %q", a, took.Round(time.Millisecond), reason)
	if len(s.GetContainers()) != 0 {
		t.Errorf("%s: containers %v, want none", a, s.GetContainers())
	}
	// A read that outlives the bound ends on the breakdown's own bound
	// (bounded.Do, the same 500 ms as the client's), which comes before
	// the client's ErrDeadline naming the socket: it names the sandbox.
	if !strings.Contains(reason, want) || want != "deadline" && !strings.Contains(reason, "runsc-"+a+".sock") ||
		want == "deadline" && !strings.Contains(reason, a) {
		t.Errorf("%s: containers absent with %q, want a reason naming %q and the sandbox (its socket, or its id on a timeout)", a, reason, want)
	}
	if strings.ContainsRune(reason, 0x1b) || strings.ContainsRune(reason, 0) || len(reason) > 1024 {
		t.Errorf("%s: reason not escaped or cut (%d bytes): %q", a, len(reason), reason)
	}
}

// absentReason is the reason of the absent field, "" when not absent.
func absentReason(abs []*sandboxstatsv1.AbsentValue, field string) string {
	for _, a := range abs {
		if a.GetField() == field {
			return a.GetReason()
		}
	}
	return ""
}

// sentryCalls counts each fake sentry's requests.
func sentryCalls(s map[string]*fakeSentry) map[string]int64 {
	out := make(map[string]int64, len(s))
	for sid, f := range s {
		out[sid] = f.calls.Load()
	}
	return out
}

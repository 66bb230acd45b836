package e2e

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestHelperWorkerPod is not a test: it is how testenv.WorkerPod runs statsd
// as the worker of TestIntegrationRunscUpstreamLayout.
func TestHelperWorkerPod(t *testing.T) { testenv.RunWorkerPod(t) }

// TestIntegrationRunscUpstreamLayout is upstream's multi-actor worker end to
// end: one real statsd runs as the worker, in the /worker leaf of the pod's
// private cgroup namespace (testenv.WorkerPod: v2, or a v1/hybrid host with
// each hierarchy mounted in it); three actors (UUID uids) each run in a real
// gVisor sandbox in its own /<uid>-_pause leaf, holding 32, 64 and 96 MiB in
// /dev/shm so that no two leaves look alike. The three are bound to that
// one statsd through RunWorkload, by the path the worker sees
// (--cgroup-path /<uid>-_pause) or by sentry pid, and StatsWorkload{actor}
// for each equals its own leaf's kernel files, read from the host around
// the call (current within 1 MiB, the sentries' memory moving meanwhile;
// peak and CPU between the two reads), never a sibling's; its source
// detail names the leaf as the worker sees it, never the pod.
//
// It needs a statsd that binds several workloads at once (--max-workloads);
// one that binds a single workload refuses the second RunWorkload with
// FAILED_PRECONDITION WORKLOAD_BOUND.
func TestIntegrationRunscUpstreamLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three real gVisor sandboxes and statsd; not under -short")
	}
	testenv.NeedRunsc(t)
	pod := testenv.MakeWorkerPod(t)
	bin := testenv.BuildBinaries(t)
	d := testenv.StartStatsd(t, pod.WrapStatsd(t, bin, "TestHelperWorkerPod"), "--max-workloads", "8")
	// statsd and its launcher are in /<pod>/worker, seen from inside as /worker.
	procs := pod.Dir("memory", "worker") + "/cgroup.procs"
	waitFor(t, 10*time.Second, func() bool {
		b, _ := os.ReadFile(procs)
		return strings.Count(string(b), "\n") >= 2
	}, "statsd and its launcher in "+procs)

	type actor struct {
		uid, leaf string
		sb        *testenv.Sandbox
		bind      []string
	}
	var actors []actor
	for i := range 3 {
		uid := testenv.NewActorUID()
		sb := testenv.StartSandbox(t, pod.SandboxPath(uid), "/bin/sh", "-c", "while true; do sleep 1; done")
		sb.Exec(t, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count="+strconv.Itoa(32*(i+1)))
		a := actor{uid: uid, leaf: testenv.PauseLeaf(uid), sb: sb}
		if a.bind = []string{"--cgroup-path", "/" + a.leaf}; i == 1 {
			a.bind = []string{"--sentry-pid", strconv.Itoa(sb.PID)}
		}
		actors = append(actors, a)
	}
	for _, a := range actors {
		statsctl(t, bin, append([]string{"run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", a.uid, "--class", "gvisor"}, a.bind...)...)
	}

	all := func() []testenv.LeafFigures {
		t.Helper()
		var k []testenv.LeafFigures
		for _, a := range actors {
			k = append(k, pod.Figures(t, a.leaf))
		}
		return k
	}
	between := func(got int64, lo, hi, slack uint64) bool {
		return uint64(got)+slack >= min(lo, hi) && uint64(got) <= max(lo, hi)+slack
	}
	const slack = 1 << 20
	for i, a := range actors {
		k0 := all()
		var w wireSample
		out := statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", a.uid, "-o", "json")
		k1 := all()
		if err := json.Unmarshal(out, &w); err != nil {
			t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
		}
		name := a.uid + " (" + strings.Join(a.bind, " ") + ")"
		t.Logf("%s: statsd current %s, peak %s, cpu %s us (%s); its leaf's files current %d..%d, peak %d..%d, cpu %d..%d us",
			name, w.MemoryCurrent, w.MemoryPeak, w.CPUUsageUsec, w.SourceDetail,
			k0[i].Current, k1[i].Current, k0[i].Peak, k1[i].Peak, k0[i].CPUUsec, k1[i].CPUUsec)
		for _, f := range []struct {
			what        string
			got         int64
			lo, hi, slk uint64
		}{
			{"memory current", w.num(t, w.MemoryCurrent), k0[i].Current, k1[i].Current, slack},
			{"memory peak", w.num(t, w.MemoryPeak), k0[i].Peak, k1[i].Peak, 0},
			{"cpu usage", w.num(t, w.CPUUsageUsec), k0[i].CPUUsec, k1[i].CPUUsec, 0},
		} {
			if !between(f.got, f.lo, f.hi, f.slk) {
				t.Errorf("%s: %s %d, its leaf's kernel file %d before and %d after (slack %d)", name, f.what, f.got, f.lo, f.hi, f.slk)
			}
		}
		for j, o := range actors {
			if j != i && between(w.num(t, w.MemoryCurrent), k0[j].Current, k1[j].Current, 8*slack) {
				t.Errorf("%s: memory current %s is sibling %s's (%d..%d)", name, w.MemoryCurrent, o.leaf, k0[j].Current, k1[j].Current)
			}
		}
		if !strings.Contains(w.SourceDetail, "/"+a.leaf) || strings.Contains(w.SourceDetail, pod.Name) {
			t.Errorf("%s: source detail %q, want the leaf as the worker sees it (/%s)", name, w.SourceDetail, a.leaf)
		}
	}
	for _, a := range actors {
		if ck := string(statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", a.uid)); !strings.Contains(ck, "checkpointed") {
			t.Errorf("%s: checkpoint:\n%s", a.uid, ck)
		}
	}
}

package nodeagent

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// foldedEntry is statsd's folded exited entry holding cpuMs.
func foldedEntry(cpuMs uint64) *sandboxstatsv1.ContainerStats {
	return gctr(identity.FoldedExitedID, identity.FoldedExitedID, cpuMs, 0, true)
}

// movedStep is one sweep of pod web-0 (at 10 s steps) and the CPU (s) its
// series by container label must show after it; nil: only the sums are
// checked.
type movedStep struct {
	s    *sandboxstatsv1.WorkloadStatsSample
	want map[string]float64
}

// checkMoved applies steps (the agent restarted with its state directory
// before step restartAt, none when < 0) and checks after each: every
// cAdvisor-shaped series never goes down, the containers plus POD are the
// pod's CPU, and the series are want where given.
func checkMoved(t *testing.T, steps []movedStep, restartAt int) {
	t.Helper()
	dir := t.TempDir()
	set := func(c *metricsConfig) { c.CPUs, c.CAdvisorCompat = 4, true }
	h := newConfiguredHarness(t, dir, containersT0, set)
	served := map[string]float64{}
	for i, st := range steps {
		at := podEpoch.Add(time.Duration(10*(i+1)) * time.Second)
		if i == restartAt {
			h = newConfiguredHarness(t, dir, at.Add(-5*time.Second), set)
		}
		h.m.Apply([]sweep.DaemonResult{okResult("s", st.s)}, at, time.Millisecond)
		cad := byContainer(gatherPrefix(t, h.reg, ""), metricCAdvisorCPU)
		pod := sumMetric(t, h.reg, metricCPUSeconds)
		var sum float64
		for c, v := range cad {
			sum += v
			if v < served[c]-1e-9 {
				t.Errorf("step %d: %s went down: %v served, now %v", i, c, served[c], v)
			}
			served[c] = v
		}
		if math.Abs(sum-pod) > 1e-9 {
			t.Errorf("step %d: containers + POD = %v, the pod's CPU %v (%v)", i, sum, pod, cad)
		}
		for c, v := range st.want {
			if math.Abs(cad[c]-v) > 1e-9 {
				t.Errorf("step %d: %s = %v, want %v (%v)", i, c, cad[c], v, cad)
			}
		}
	}
}

// TestFoldedExitedChargedOnce (31b-review finding 3's proof): statsd folds
// exited job-1 (1 s) and job-2 (2 s), already charged under their ids, into
// the folded entry (3 s): the entry is charged only what the folded ones
// had not been charged (nothing), so the containers plus POD stay the pod's
// CPU (3.3 s, not 6.3 s). A later fold of job-3 (grown 0.5 s since it was
// last seen, as the budget's cut may fold one that just exited) charges
// that 0.5 s once. Also across an agent restart with --state-dir.
func TestFoldedExitedChargedOnce(t *testing.T) {
	steps := []movedStep{
		{gvisorPod(10, 100, gctr("e1", "job-1", 1000, 0, true), gctr("e2", "job-2", 2000, 0, true), gctr("e3", "job-3", 500, 1, false), gctr("x", "app", 100, 1, false)),
			map[string]float64{"job-1": 1, "job-2": 2, "job-3": 0.5, "app": 0.1, "POD": 0.1}},
		{gvisorPod(20, 200, foldedEntry(3000), gctr("e3", "job-3", 500, 1, false), gctr("x", "app", 200, 1, false)),
			map[string]float64{"job-1": 1, "job-2": 2, "job-3": 0.5, "app": 0.2, identity.FoldedExitedID: 0, "POD": 0.2}},
		{gvisorPod(30, 300, foldedEntry(4000), gctr("x", "app", 300, 1, false)),
			map[string]float64{"job-1": 1, "job-2": 2, "job-3": 0.5, "app": 0.3, identity.FoldedExitedID: 0.5, "POD": 0.3}},
	}
	for _, restartAt := range []int{-1, 1, 2} {
		t.Run(fmt.Sprintf("restart before step %d", restartAt), func(t *testing.T) { checkMoved(t, steps, restartAt) })
	}
}

// TestMergedByNameKeepsSeries: statsd merges a2 (restarted "app", exited
// at 0.6 s) into the exited entry of its name (a1, 1 s): one entry, id a2,
// 1.6 s. The agent's app series is the truth, 1.6 s, not 2.6 s, and the
// next restart (a3) adds only its own CPU.
func TestMergedByNameKeepsSeries(t *testing.T) {
	steps := []movedStep{
		{gvisorPod(10, 100, gctr("a1", "app", 1000, 0, true), gctr("a2", "app", 500, 1, false)), map[string]float64{"app": 1.5}},
		{gvisorPod(20, 200, gctr("a2", "app", 1600, 0, true)), map[string]float64{"app": 1.6}},
		{gvisorPod(30, 300, gctr("a2", "app", 1600, 0, true), gctr("a3", "app", 200, 1, false)), map[string]float64{"app": 1.8}},
		{gvisorPod(40, 400, gctr("a3", "app", 1900, 0, true)), map[string]float64{"app": 1.9}},
	}
	for _, restartAt := range []int{-1, 1, 3} {
		t.Run(fmt.Sprintf("restart before step %d", restartAt), func(t *testing.T) { checkMoved(t, steps, restartAt) })
	}
}

// TestCrashLoopBackOffSeries: 40 runs of one container name (each a new
// id, 0.1 s then exiting at 0.15 s), as statsd shows them (identity merges
// each exit into the exited entry of its name): the app series is the
// truth after every sweep and never goes down. With the budget's cut
// folding the exited entries (init's and app's) every other sweep, the
// sums still hold and no series goes down.
func TestCrashLoopBackOffSeries(t *testing.T) {
	for _, flap := range []bool{false, true} {
		for _, restartAt := range []int{-1, 41} {
			t.Run(fmt.Sprintf("budget fold %v, restart before step %d", flap, restartAt), func(t *testing.T) {
				var (
					steps  []movedStep
					exited uint64 // app's exited entry (ms)
					ownMs  uint64
				)
				const initMs = 50
				for i := range 40 {
					id := fmt.Sprintf("app-%02d", i)
					prev := fmt.Sprintf("app-%02d", i-1)
					for phase, live := range []bool{true, false} {
						ownMs += 10
						var cs []*sandboxstatsv1.ContainerStats
						ex := []*sandboxstatsv1.ContainerStats{gctr("init", "init", initMs, 0, true)}
						truth := exited
						if live {
							if i > 0 {
								ex = append(ex, gctr(prev, "app", exited, 0, true))
							}
							cs = append(cs, gctr(id, "app", 100, 1, false))
							truth += 100
						} else {
							exited += 150
							truth = exited
							ex = append(ex, gctr(id, "app", exited, 0, true))
						}
						want := map[string]float64{"app": float64(truth) / 1000, "init": initMs / 1000.0}
						if flap && (2*i+phase)%2 == 1 && len(ex) > 1 {
							var sum uint64
							for _, e := range ex {
								sum += e.GetCpuUsageUsec() / 1000
							}
							ex, want = []*sandboxstatsv1.ContainerStats{foldedEntry(sum)}, nil
						}
						if flap {
							want = nil
						}
						steps = append(steps, movedStep{gvisorPod(10*(len(steps)+1), ownMs, append(cs, ex...)...), want})
					}
				}
				checkMoved(t, steps, restartAt)
			})
		}
	}
}

// TestFoldedAtTheEndChargedOnce: the final folds job-1 and job-2 (charged
// under their ids at the last sweep) and app exits: the folded entry's
// tail charges nothing, app's its own 0.1 s, and served twice the end
// charges once: the containers plus POD are the pod's CPU.
func TestFoldedAtTheEndChargedOnce(t *testing.T) {
	dir := t.TempDir()
	set := func(c *metricsConfig) { c.CPUs, c.CAdvisorCompat = 4, true }
	h := newConfiguredHarness(t, dir, containersT0, set)
	last := gvisorPod(10, 100, gctr("e1", "job-1", 1000, 0, true), gctr("e2", "job-2", 2000, 0, true), gctr("x", "app", 100, 1, false))
	final := gvisorPod(20, 200, foldedEntry(3000), gctr("x", "app", 200, 0, true))
	h.m.Apply([]sweep.DaemonResult{okResult("s", last)}, podEpoch.Add(10*time.Second), time.Millisecond)
	e := endedOf(final, podEpoch.Add(20*time.Second), final.GetCpuUsageUsec())
	for i := range 2 {
		h.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{e}}}, podEpoch.Add(time.Duration(20+10*i)*time.Second), time.Millisecond)
		cad := byContainer(gatherPrefix(t, h.reg, ""), metricCAdvisorCPU)
		pod := sumMetric(t, h.reg, metricCPUSeconds)
		want := map[string]float64{"job-1": 1, "job-2": 2, "app": 0.2, identity.FoldedExitedID: 0, "POD": 0.2}
		var sum float64
		for c, v := range cad {
			sum += v
			if math.Abs(want[c]-v) > 1e-9 {
				t.Errorf("served %d: %s = %v, want %v", i+1, c, v, want[c])
			}
		}
		if math.Abs(sum-pod) > 1e-9 || math.Abs(pod-3.4) > 1e-9 {
			t.Errorf("served %d: containers + POD = %v, the pod's CPU %v, want both 3.4", i+1, sum, pod)
		}
	}
}

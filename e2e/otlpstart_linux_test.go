package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// actorCPUPoints returns the container.cpu.time points of actor's series
// (--label-actor), as the Collector got them.
func actorCPUPoints(pts []testenv.CollectedPoint, actor string) []testenv.CollectedPoint {
	var out []testenv.CollectedPoint
	for _, p := range pts {
		if p.Metric == "container.cpu.time" && p.Attributes["sandboxstats.actor.uid"] == actor {
			out = append(out, p)
		}
	}
	return out
}

// TestIntegrationOTLPStartAcrossAgentRestart: the statsagent binary with
// --state-dir, pushing OTLP to the real Collector, is SIGKILLed while a
// workload burns CPU in a real cgroup, and started again on the same state
// directory. The workload's container.cpu.time keeps one start time over
// both processes (OTLP: no reset) while its value goes on growing; the
// agent's own sweep counter, which starts again, gets a new one.
func TestIntegrationOTLPStartAcrossAgentRestart(t *testing.T) {
	needCgroups(t)
	if testenv.InVMLane() {
		t.Skip("the VM lane's guest has no collector: the host's run holds this test")
	}
	start := time.Now()
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	col := testenv.StartCollector(t, testenv.WithCollectorSocket(filepath.Join(t.TempDir(), "otlp.sock")))
	lc := lifecycleClient(t, startStatsdIn(t, bin, dir, "s").Lifecycle)
	actor := fmt.Sprintf("otlpstart-%d", os.Getpid())
	cg := "/" + actor
	testCgroup(t, cg)
	w := testenv.StartChild(t, "TestWorkloadChild")
	defer w.Kill()
	run(t, lc, actor, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg})
	moveTo(t, cg, w.Cmd.Process.Pid)

	args := []string{"--sockets", filepath.Join(dir, "stats", "*.sock"), "--interval", "500ms", "--min-interval", "100ms",
		"--timeout", "400ms", "--otlp-endpoint", "unix://" + col.Socket(), "--otlp-periodic-every", "0",
		"--label-actor", "--state-dir", filepath.Join(dir, "agent-state")}
	agent := startGapAgent(t, bin, filepath.Join(dir, "statsagent-0.log"), args...)
	w.Do(t, "burn 200")
	col.WaitMetrics(t, 15*time.Second, func(p []testenv.CollectedPoint) bool {
		pts := actorCPUPoints(p, actor)
		return len(pts) > 0 && pts[len(pts)-1].Value >= 0.15
	})
	testenv.WaitNewSweeps(t, agent.url)
	agent.kill(t)
	killed := uint64(time.Now().UnixNano())
	w.Do(t, "burn 200")
	startGapAgent(t, bin, filepath.Join(dir, "statsagent-1.log"), args...) // stopped at the test's end
	pts := col.WaitMetrics(t, 15*time.Second, func(p []testenv.CollectedPoint) bool {
		pts := actorCPUPoints(p, actor)
		return len(pts) > 0 && pts[len(pts)-1].TimeUnixNano > killed && pts[len(pts)-1].Value >= 0.35
	})

	cpu := actorCPUPoints(pts, actor)
	var before, after int
	var last float64
	cpuStarts := map[uint64]bool{}
	for _, p := range cpu {
		cpuStarts[p.StartUnixNano] = true
		if p.TimeUnixNano < killed {
			before++
		} else {
			after++
		}
		if p.StartUnixNano != cpu[0].StartUnixNano {
			t.Errorf("container.cpu.time at %d: start %d, the first point's %d: a reset to OTLP", p.TimeUnixNano, p.StartUnixNano, cpu[0].StartUnixNano)
		}
		if p.Value < last {
			t.Errorf("container.cpu.time at %d: %v s, down from %v", p.TimeUnixNano, p.Value, last)
		}
		last = p.Value
	}
	sweepStarts := map[uint64]bool{}
	for _, p := range pts {
		if p.Metric == "sandboxstats.agent.sweeps" {
			sweepStarts[p.StartUnixNano] = true
		}
	}
	t.Logf("container.cpu.time: %d points before the kill, %d after, %d start times (the first %v), last %.3f s; sandboxstats.agent.sweeps: %d start times; took %v",
		before, after, len(cpuStarts), time.Unix(0, int64(cpu[0].StartUnixNano)).UTC(), last, len(sweepStarts), time.Since(start).Round(time.Millisecond))
	if before == 0 || after == 0 {
		t.Errorf("container.cpu.time: %d points before the kill, %d after; want both", before, after)
	}
	if len(sweepStarts) != 2 {
		t.Errorf("sandboxstats.agent.sweeps: %d start times, want 2 (it starts again with each process)", len(sweepStarts))
	}
}

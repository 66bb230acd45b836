package nodeagent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// gctr is a container of a gVisor sample: CPU in ms, pids; exited: its
// counter is its last, its gauges absent (ContainerStats.exited).
func gctr(id, name string, cpuMs, pids uint64, exited bool) *sandboxstatsv1.ContainerStats {
	c := &sandboxstatsv1.ContainerStats{Id: id, Name: name, CpuUsageUsec: proto.Uint64(cpuMs * 1000), Exited: exited}
	if exited {
		c.Absent = []*sandboxstatsv1.AbsentValue{{Field: "pids_current", Reason: "exited"}}
	} else {
		c.PidsCurrent = proto.Uint64(pids)
	}
	return c
}

// gvisorPod is pod web-0's gVisor sample at podEpoch+sec: its containers,
// its own share (ms) and the pod's CPU, their sum.
func gvisorPod(sec int, ownMs uint64, cs ...*sandboxstatsv1.ContainerStats) *sandboxstatsv1.WorkloadStatsSample {
	s := sample("w1", 0, 64<<20)
	s.ActorName = "web-0"
	s.EpochUnixNano = podEpoch.UnixNano()
	s.ObservedAtUnixNano = podEpoch.Add(time.Duration(sec) * time.Second).UnixNano()
	sum := ownMs * 1000
	for _, c := range cs {
		sum += c.GetCpuUsageUsec()
	}
	s.CpuUsageUsec, s.SandboxOwnCpuUsec, s.Containers = proto.Uint64(sum), proto.Uint64(ownMs*1000), cs
	return s
}

// exitedRuns are pod web-0's sweeps (at 10, 20, 30 s) and its end (40 s):
// app (a1) exits after 3 s of CPU and is restarted as a2 (a new id, the
// same name); the sidecar exits at 1.2 s; the own share grows beside.
// want are the series by container label after each, POD the own share
// (seconds); pids the pids gauges (an exited container has none).
var exitedRuns = []struct {
	s    *sandboxstatsv1.WorkloadStatsSample
	want map[string]float64
	pids map[string]float64
}{
	{gvisorPod(10, 300, gctr("a1", "app", 2000, 3, false), gctr("s1", "sidecar", 500, 1, false)),
		map[string]float64{"app": 2, "sidecar": 0.5, "POD": 0.3}, map[string]float64{"app": 3, "sidecar": 1}},
	{gvisorPod(20, 600, gctr("a1", "app", 3000, 0, true), gctr("s1", "sidecar", 1000, 1, false), gctr("a2", "app", 400, 2, false)),
		map[string]float64{"app": 3.4, "sidecar": 1, "POD": 0.6}, map[string]float64{"app": 2, "sidecar": 1}},
	{gvisorPod(30, 900, gctr("a1", "app", 3000, 0, true), gctr("s1", "sidecar", 1200, 0, true), gctr("a2", "app", 1500, 2, false)),
		map[string]float64{"app": 4.5, "sidecar": 1.2, "POD": 0.9}, map[string]float64{"app": 2}},
	{gvisorPod(40, 1100, gctr("a1", "app", 3000, 0, true), gctr("s1", "sidecar", 1200, 0, true), gctr("a2", "app", 2500, 2, false)),
		map[string]float64{"app": 5.5, "sidecar": 1.2, "POD": 1.1}, map[string]float64{"app": 2}},
}

// byContainer returns metric's series by their container label.
func byContainer(all map[string]float64, metric string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range all {
		if !strings.HasPrefix(k, metric+"{") {
			continue
		}
		i := strings.Index(k, "container=") + len("container=")
		if strings.HasPrefix(k[i:], identity.FoldedExitedID) { // a comma in it
			out[identity.FoldedExitedID] = v
			continue
		}
		out[k[i:i+strings.IndexAny(k[i:], ",}")]] = v
	}
	return out
}

// TestContainersExited: an exited container keeps its last CPU (charged
// up to it, never reset) and loses its gauges; restarted under the same
// name (a new id) it and its predecessor make one series that never
// decreases, in statsagent's own series and in the cAdvisor-shaped one;
// the own share is its own counter (Prometheus and OTLP) and
// container="POD" in the cAdvisor-shaped export, so that the containers
// and POD sum to the pod's CPU after every sweep and at the end (served
// twice: charged once). Also with the agent restarted with its state
// directory between the second and third sweeps.
func TestContainersExited(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			dir := t.TempDir()
			set := func(c *metricsConfig) { c.CPUs, c.CAdvisorCompat = 4, true }
			h := newConfiguredHarness(t, dir, containersT0, set)
			served := map[string]float64{}
			for i, run := range exitedRuns {
				at := podEpoch.Add(time.Duration(10*(i+1)) * time.Second)
				if restart && i == 2 {
					h = newConfiguredHarness(t, dir, at.Add(-5*time.Second), set)
				}
				r := okResult("s", run.s)
				if i == len(exitedRuns)-1 { // the end, served twice
					e := endedOf(run.s, at, run.s.GetCpuUsageUsec())
					r = sweep.DaemonResult{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{e}}
					h.m.Apply([]sweep.DaemonResult{r}, at, time.Millisecond)
					at = at.Add(10 * time.Second)
				}
				h.m.Apply([]sweep.DaemonResult{r}, at, time.Millisecond)
				all := gatherPrefix(t, h.reg, "")
				cadvisor := byContainer(all, metricCAdvisorCPU)
				if diff := cmp.Diff(run.want, cadvisor, approx()); diff != "" {
					t.Errorf("step %d: %s (-want +got):\n%s", i, metricCAdvisorCPU, diff)
				}
				own := byContainer(all, metricContainerCPU)
				want := map[string]float64{"app": run.want["app"], "sidecar": run.want["sidecar"]}
				if diff := cmp.Diff(want, own, approx()); diff != "" {
					t.Errorf("step %d: %s (-want +got):\n%s", i, metricContainerCPU, diff)
				}
				for c, v := range cadvisor {
					if v < served[c]-1e-9 {
						t.Errorf("step %d: container %s went down: %v served, now %v", i, c, served[c], v)
					}
					served[c] = v
				}
				ownShare := sumMetric(t, h.reg, metricSandboxOwnCPU)
				pod := sumMetric(t, h.reg, metricCPUSeconds)
				if d := ownShare - run.want["POD"]; d > 1e-9 || d < -1e-9 {
					t.Errorf("step %d: %s = %v, want %v", i, metricSandboxOwnCPU, ownShare, run.want["POD"])
				}
				if sum := cadvisor["app"] + cadvisor["sidecar"] + cadvisor["POD"]; sum-pod > 1e-9 || pod-sum > 1e-9 {
					t.Errorf("step %d: containers + POD = %v, the pod's CPU %v", i, sum, pod)
				}
				if i < len(exitedRuns)-1 { // after the end: charged, not sampled
					if diff := cmp.Diff(run.pids, byContainer(all, metricContainerPids), approx()); diff != "" {
						t.Errorf("step %d: pids (-want +got):\n%s", i, diff)
					}
				}
			}
			var otlpOwn float64
			for _, sm := range h.collect(t).ScopeMetrics {
				for _, m := range sm.Metrics {
					if m.Name == "sandboxstats.workload.sandbox_own.cpu.time" {
						otlpOwn = otlpSums(m)[""]
					}
				}
			}
			if d := otlpOwn - 1.1; d > 1e-9 || d < -1e-9 {
				t.Errorf("OTLP own share %v, want 1.1", otlpOwn)
			}
		})
	}
}

// TestOTelContainerCardinality: with LabelActor, 1000 workloads of 18
// containers each (16 by name and two folded into (other) at the default
// MaxContainers: 17 series each) give 17,000 points of the container CPU
// counter and of a container gauge, none folded into the overflow point
// under the limits the pipeline sets (OTelPipelineCardinalityLimit, and
// OTelContainerCardinalityLimit for the agent's own counter); the
// workload instruments' limit alone would fold some.
func TestOTelContainerCardinality(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	h := newOTelHarness(t, metricsConfig{Grace: time.Hour, Started: t0.Add(-time.Hour), CPUs: 2, LabelActor: true}, 0)
	results := benchResults(benchDaemons, t0)
	for i, r := range results {
		s := r.Samples[0]
		s.TemplateName = fmt.Sprintf("fresh-%04d", i)
		for c := range DefaultMaxContainers + 2 {
			s.Containers = append(s.Containers, gctr(fmt.Sprintf("c%02d", c), fmt.Sprintf("n%02d", c), 10, 1, false))
		}
	}
	h.m.Apply(results, t0, time.Millisecond)
	advance(results, t0.Add(time.Minute))
	h.m.Apply(results, t0.Add(time.Minute), time.Millisecond)
	want := benchDaemons * (DefaultMaxContainers + 1)
	for _, sm := range h.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sandboxstats.container.cpu.time" && m.Name != "sandboxstats.container.pids" {
				continue
			}
			_, sets := instrumentOf(m)
			overflow := 0
			for _, set := range sets {
				if set.HasValue("otel.metric.overflow") {
					overflow++
				}
			}
			if overflow != 0 || len(sets) != want {
				t.Errorf("%s: %d points, %d overflow; want %d, none", m.Name, len(sets), overflow, want)
			}
		}
	}
	old, _ := containerCounters(h.m.snap.Load(), true, OTelCardinalityLimit(0), t0)
	if _, sets := instrumentOf(old); !sets[len(sets)-1].HasValue("otel.metric.overflow") {
		t.Errorf("the workload instruments' limit %d folds none of %d container series: the test shows nothing", OTelCardinalityLimit(0), want)
	}
	t.Logf("limits: workload %d, container %d (pipeline %d); %d container series",
		OTelCardinalityLimit(0), OTelContainerCardinalityLimit(0, 0), OTelPipelineCardinalityLimit(0, 0), want)
}

package nodeagent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ctr is a container of a guest agent's sample: cpu in ms, memory in MiB.
func ctr(id, name string, cpuMs, memMiB, pids uint64) *sandboxstatsv1.ContainerStats {
	return &sandboxstatsv1.ContainerStats{Id: id, Name: name, CpuUsageUsec: proto.Uint64(cpuMs * 1000),
		MemoryCurrentBytes: proto.Uint64(memMiB << 20), MemoryWorkingSetBytes: proto.Uint64(memMiB << 19), MemoryIsOwn: true,
		PidsCurrent: proto.Uint64(pids)}
}

// podEpoch is the epoch of podSample's activations: after containersT0,
// when the agents of these tests start.
var (
	containersT0 = time.Date(2026, 11, 29, 15, 59, 0, 0, time.UTC)
	podEpoch     = time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC)
)

// podSample is a guest agent's sample of pod w1 at podEpoch+sec seconds,
// its first read (at podEpoch+1s) holding first's containers.
func podSample(sec int, first []*sandboxstatsv1.ContainerStats, cs ...*sandboxstatsv1.ContainerStats) *sandboxstatsv1.WorkloadStatsSample {
	s := guestSample("w1", 0, 64<<20)
	s.ActorName = "web-0"
	s.EpochUnixNano = podEpoch.UnixNano()
	s.ObservedAtUnixNano = podEpoch.Add(time.Duration(sec) * time.Second).UnixNano()
	var sum uint64
	for _, c := range cs {
		sum += c.GetCpuUsageUsec()
	}
	s.CpuUsageUsec = proto.Uint64(sum)
	s.Containers = cs
	s.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ,
		ObservedAtUnixNano: podEpoch.Add(time.Second).UnixNano(),
		FirstRead:          &sandboxstatsv1.WorkloadStatsSample{CpuUsageUsec: proto.Uint64(0), Containers: first}}
	return s
}

// gatherPrefix is gather for the series whose names start with prefix.
func gatherPrefix(t *testing.T, reg prometheus.Gatherer, prefix string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), prefix) {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if m.Counter != nil {
				v = m.GetCounter().GetValue()
			}
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// containerCPU returns the per-container CPU counters by container label.
func containerCPU(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	return byContainer(gatherPrefix(t, reg, metricContainerCPU), metricContainerCPU)
}

// containerSweeps are the sweeps of pod w1: three containers; d added
// (after the first read) and b removed mid-activation; the end at 40 s
// with the final's containers (b not among them). first is the first
// read's containers. truth is each container's own CPU (seconds) at the
// end.
var (
	first         = []*sandboxstatsv1.ContainerStats{ctr("a", "app", 100, 0, 0), ctr("b", "sidecar", 50, 0, 0), ctr("c", "", 2, 0, 0)}
	containerRuns = [][]*sandboxstatsv1.ContainerStats{
		{ctr("a", "app", 1000, 100, 5), ctr("b", "sidecar", 500, 20, 2), ctr("c", "", 10, 8, 1)},
		{ctr("a", "app", 3000, 120, 5), ctr("b", "sidecar", 1000, 20, 2), ctr("c", "", 20, 8, 1), ctr("d", "debug", 400, 4, 1)},
		{ctr("a", "app", 5000, 130, 6), ctr("c", "", 30, 8, 1), ctr("d", "debug", 1000, 4, 1)},
	}
	finalContainers = []*sandboxstatsv1.ContainerStats{ctr("a", "app", 6000, 130, 6), ctr("c", "", 40, 8, 1), ctr("d", "debug", 1500, 4, 1)}
	containerTruth  = map[string]float64{"app": 5.9, "sidecar": 0.95, "c": 0.038, "debug": 1.5}
)

func containerEnd() *sandboxstatsv1.EndedActivation {
	final := podSample(40, first, finalContainers...)
	return endedOf(final, podEpoch.Add(40*time.Second), final.GetCpuUsageUsec())
}

// TestContainersCharged: each container's exported CPU equals its own
// (its counter minus its first read, 0 for one added after it) over
// sweeps, a container added and one removed mid-activation, and the end
// (the final's containers, charged once); its gauges are those of the
// last sweep, absent where absent.
func TestContainersCharged(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: containersT0, CPUs: 4}, discard())
	if err != nil {
		t.Fatal(err)
	}
	for i, cs := range containerRuns {
		at := podEpoch.Add(time.Duration(10*(i+1)) * time.Second)
		m.Apply([]sweep.DaemonResult{okResult("s", podSample(10*(i+1), first, cs...))}, at, time.Millisecond)
	}
	got := gatherPrefix(t, reg, "sandboxstats_container_")
	l := ",sandbox_class=microvm,source=guest-agent,template_name=python,template_namespace=templates}"
	want := map[string]float64{
		metricContainerCPU + "{container=app" + l: 4.9, metricContainerCPU + "{container=sidecar" + l: 0.95,
		metricContainerCPU + "{container=c" + l: 0.028, metricContainerCPU + "{container=debug" + l: 1.0,
		metricContainerMemory + "{container=app" + l: 130 << 20, metricContainerMemory + "{container=c" + l: 8 << 20, metricContainerMemory + "{container=debug" + l: 4 << 20,
		metricContainerWorkingSet + "{container=app" + l: 65 << 20, metricContainerWorkingSet + "{container=c" + l: 4 << 20, metricContainerWorkingSet + "{container=debug" + l: 2 << 20,
		metricContainerPids + "{container=app" + l: 6, metricContainerPids + "{container=c" + l: 1, metricContainerPids + "{container=debug" + l: 1,
	}
	if diff := cmp.Diff(want, got, approx()); diff != "" {
		t.Errorf("after the sweeps (-want +got):\n%s", diff)
	}
	end := containerEnd()
	for range 2 { // served twice: charged once
		m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{end}}},
			podEpoch.Add(50*time.Second), time.Millisecond)
	}
	if diff := cmp.Diff(containerTruth, containerCPU(t, reg), approx()); diff != "" {
		t.Errorf("at the end (-want +got):\n%s", diff)
	}
}

// TestContainersWithoutMemory: a container whose memory is not its own
// (gVisor's sandbox total) or without pids has no such series: absent,
// not zero; its CPU is exported.
func TestContainersWithoutMemory(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: containersT0, CPUs: 4}, discard())
	if err != nil {
		t.Fatal(err)
	}
	s := sample("w1", 2_000_000, 64<<20)
	s.ObservedAtUnixNano = podEpoch.Add(10 * time.Second).UnixNano()
	s.Containers = []*sandboxstatsv1.ContainerStats{{Id: "a", Name: "app", CpuUsageUsec: proto.Uint64(1_500_000), MemoryCurrentBytes: proto.Uint64(1 << 20)}}
	m.Apply([]sweep.DaemonResult{okResult("s", s)}, podEpoch.Add(10*time.Second), time.Millisecond)
	want := map[string]float64{metricContainerCPU + "{container=app,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 1.5}
	if diff := cmp.Diff(want, gatherPrefix(t, reg, "sandboxstats_container_"), approx()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestContainersCap: past MaxContainers a sample's containers are
// container="(other)", their CPU summed there, each counted.
func TestContainersCap(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: containersT0, CPUs: 4, MaxContainers: 2}, discard())
	if err != nil {
		t.Fatal(err)
	}
	cs := []*sandboxstatsv1.ContainerStats{ctr("a", "a", 1000, 1, 1), ctr("b", "b", 500, 1, 1), ctr("c", "c", 200, 1, 1), ctr("d", "d", 300, 1, 1)}
	m.Apply([]sweep.DaemonResult{okResult("s", podSample(10, nil, cs...))}, podEpoch.Add(10*time.Second), time.Millisecond)
	want := map[string]float64{"a": 1, "b": 0.5, otherContainer: 0.5}
	if diff := cmp.Diff(want, containerCPU(t, reg), approx()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := gather(t, reg)[metricContainersFolded+"{}"]; got != 2 {
		t.Errorf("folded = %v, want 2", got)
	}
}

// TestCAdvisorCompat: with CAdvisorCompat the containers are also served
// under cAdvisor's names and labels (namespace and pod from the actor),
// absent where absent.
func TestCAdvisorCompat(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: containersT0, CPUs: 4, CAdvisorCompat: true}, discard())
	if err != nil {
		t.Fatal(err)
	}
	cs := []*sandboxstatsv1.ContainerStats{ctr("a", "app", 2000, 100, 3), {Id: "b", Name: "idle", CpuUsageUsec: proto.Uint64(40_000)}}
	m.Apply([]sweep.DaemonResult{okResult("s", podSample(10, nil, cs...))}, podEpoch.Add(10*time.Second), time.Millisecond)
	want := map[string]float64{
		`container_cpu_usage_seconds_total{container=app,image=(sandboxstats),namespace=team-a,pod=web-0}`:  2,
		`container_cpu_usage_seconds_total{container=idle,image=(sandboxstats),namespace=team-a,pod=web-0}`: 0.04,
		`container_memory_usage_bytes{container=app,image=(sandboxstats),namespace=team-a,pod=web-0}`:       100 << 20,
		`container_memory_working_set_bytes{container=app,image=(sandboxstats),namespace=team-a,pod=web-0}`: 50 << 20,
	}
	if diff := cmp.Diff(want, gatherPrefix(t, reg, "container_"), approx()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestContainersAcrossRestart: an agent restarted with its state
// directory between the sweeps continues each container's CPU (never
// lower than served), charges the sweeps and the end after it, and each
// container's CPU at the end is its truth; the cAdvisor-shaped series
// continue alike.
func TestContainersAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	set := func(c *metricsConfig) { c.CPUs, c.CAdvisorCompat = 4, true }
	h := newConfiguredHarness(t, dir, containersT0, set)
	for i, cs := range containerRuns[:2] {
		at := podEpoch.Add(time.Duration(10*(i+1)) * time.Second)
		h.m.Apply([]sweep.DaemonResult{okResult("s", podSample(10*(i+1), first, cs...))}, at, time.Millisecond)
	}
	before := containerCPU(t, h.reg)

	h = newConfiguredHarness(t, dir, podEpoch.Add(25*time.Second), set)
	h.m.Apply([]sweep.DaemonResult{okResult("s", podSample(30, first, containerRuns[2]...))}, podEpoch.Add(30*time.Second), time.Millisecond)
	after := containerCPU(t, h.reg)
	for c, v := range before {
		if after[c] < v-1e-9 {
			t.Errorf("container %s: %v served before the restart, %v after", c, v, after[c])
		}
	}
	if got, want := after["app"], 4.9; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("app after the restart's first sweep: %v, want %v", got, want)
	}
	h.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{containerEnd()}}},
		podEpoch.Add(50*time.Second), time.Millisecond)
	if diff := cmp.Diff(containerTruth, containerCPU(t, h.reg), approx()); diff != "" {
		t.Errorf("at the end (-want +got):\n%s", diff)
	}
	cadvisor := byContainer(gatherPrefix(t, h.reg, metricCAdvisorCPU), metricCAdvisorCPU)
	if diff := cmp.Diff(containerTruth, cadvisor, approx()); diff != "" {
		t.Errorf("cAdvisor-shaped at the end (-want +got):\n%s", diff)
	}
}

// TestLabelWorkerPool: with LabelWorkerPool the workload and container
// series carry worker_pool beside the template labels (empty for none),
// also after a restart with the state directory.
func TestLabelWorkerPool(t *testing.T) {
	dir := t.TempDir()
	set := func(c *metricsConfig) { c.CPUs, c.LabelWorkerPool = 4, true }
	h := newConfiguredHarness(t, dir, containersT0, set)
	s := podSample(10, nil, ctr("a", "app", 1000, 1, 1))
	s.WorkerPool = "pool-a"
	h.m.Apply([]sweep.DaemonResult{okResult("s", s)}, podEpoch.Add(10*time.Second), time.Millisecond)
	h = newConfiguredHarness(t, dir, podEpoch.Add(15*time.Second), set)
	s = podSample(20, nil, ctr("a", "app", 3000, 1, 1))
	s.WorkerPool = "pool-a"
	h.m.Apply([]sweep.DaemonResult{okResult("s", s)}, podEpoch.Add(20*time.Second), time.Millisecond)
	got := gather(t, h.reg)
	l := "sandbox_class=microvm,source=guest-agent,template_name=python,template_namespace=templates,worker_pool=pool-a}"
	for k, want := range map[string]float64{
		metricCPUSeconds + "{" + l:                 3,
		metricContainerCPU + "{container=app," + l: 3,
	} {
		if v, ok := got[k]; !ok || v < want-1e-9 || v > want+1e-9 {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

package nodeagent

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// gather returns the workload and sweep series of reg as "name{k=v,...}" ->
// value, labels sorted, leaving out the Go/process collectors.
func gather(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "sandboxstats_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(ls)
			key := f.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Histogram != nil && f.GetName() != metricSweepDuration:
				labels := "{" + strings.Join(ls, ",") + "}"
				out[f.GetName()+"_sum"+labels] = m.GetHistogram().GetSampleSum()
				out[f.GetName()+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// pick returns the series of the named metric only.
func pick(all map[string]float64, name string) map[string]float64 {
	out := make(map[string]float64)
	for k, v := range all {
		if strings.HasPrefix(k, name+"{") {
			out[strings.TrimPrefix(k, name)] = v
		}
	}
	return out
}

const (
	lCgroup = "{sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}"
	lGuest  = "{sandbox_class=microvm,source=guest-agent,template_name=python,template_namespace=templates}"
	lUnspec = "{sandbox_class=gvisor,source=unspecified,template_name=python,template_namespace=templates}"
)

func guestSample(actor string, cpuUsec, memCur uint64) *sandboxstatsv1.WorkloadStatsSample {
	s := sample(actor, cpuUsec, memCur)
	s.SandboxClass = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM
	s.Source = sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
	s.MemoryPeakBytes = nil
	return s
}

func okResult(sock string, s ...*sandboxstatsv1.WorkloadStatsSample) sweep.DaemonResult {
	return sweep.DaemonResult{Socket: sock, Status: sweep.StatusOK, Samples: s}
}

func TestMetricsAcrossSweeps(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	// The agent started at t0: the workloads' epoch (16:00) began before it,
	// w1's restore (17:01:30) after.
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0}, discard())
	if err != nil {
		t.Fatal(err)
	}
	unmeasured := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "w4", TemplateNamespace: "templates", TemplateName: "python",
		SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR}
	hung := sweep.DaemonResult{Socket: "h", Status: sweep.StatusError, Code: codes.DeadlineExceeded}

	// Sweep 1: first sight of everything charges nothing.
	m.Apply([]sweep.DaemonResult{
		okResult("1", sample("w1", 10_000_000, 100<<20)),
		okResult("2", sample("w2", 5_000_000, 50<<20)),
		okResult("3", guestSample("w3", 7_000_000, 30<<20)),
		okResult("4", unmeasured),
		{Socket: "5", Status: sweep.StatusNoSample},
	}, t0, 120*time.Millisecond)
	got := gather(t, reg)
	want := map[string]float64{
		metricMemoryCurrent + lCgroup:        150 << 20, // w1 + w2: same source and template
		metricMemoryCurrent + lGuest:         30 << 20,  // another layer: never summed with cgroup
		metricMemoryWorkingSet + lCgroup:     75 << 20,
		metricMemoryWorkingSet + lGuest:      15 << 20,
		metricMemoryPeak + lCgroup:           300 << 20, // no peak series for the guest agent: absent, not 0
		metricCPUSeconds + lCgroup:           0,
		metricCPUSeconds + lGuest:            0,
		metricSampledWorkloads + lCgroup:     2,
		metricSampledWorkloads + lGuest:      1,
		metricSampledWorkloads + lUnspec:     1, // counted, but no numbers
		metricDaemons + "{result=ok}":        4,
		metricDaemons + "{result=no-sample}": 1,
		metricDaemons + "{result=error}":     0,
		metricDaemons + "{result=vanished}":  0,
		metricDaemons + "{result=skipped}":   0,
		metricActorConflicts + "{}":          0,
		metricContainersFolded + "{}":        0,
		metricLastSweepSeconds + "{}":        0.12,
		metricLastSweepTime + "{}":           float64(t0.Unix()),
		metricSweeps + "{}":                  1,
		metricTemplatesFolded + "{}":         0,
	}
	for _, k := range []string{metricImplausibleSamples + "{reason=absurd}", metricImplausibleSamples + "{reason=growth}", metricImplausibleSamples + "{reason=overflow}", metricEndedEvicted + "{}", metricEndedLost + "{}"} {
		want[k] = 0 // nothing refused, nothing evicted, nothing lost
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("sweep 1 (-want +got):\n%s", diff)
	}

	// Sweep 2: deltas are charged.
	m.Apply([]sweep.DaemonResult{
		okResult("1", sample("w1", 12_000_000, 100<<20)),
		okResult("2", sample("w2", 5_500_000, 50<<20)),
		okResult("3", guestSample("w3", 8_000_000, 30<<20)),
	}, t0.Add(time.Minute), 0)
	cpu := pick(gather(t, reg), metricCPUSeconds)
	if diff := cmp.Diff(map[string]float64{lCgroup: 2.5, lGuest: 1}, cpu); diff != "" {
		t.Fatalf("sweep 2 cpu (-want +got):\n%s", diff)
	}

	// Sweep 3: w1 restored (new epoch, counter from 0), w2's daemon hung,
	// w3 gone. Gauges show only what this sweep saw; the counter keeps
	// growing and never decreases.
	w1 := sample("w1", 300_000, 40<<20)
	w1.EpochUnixNano = t0.Add(90 * time.Second).UnixNano()
	w1.ObservedAtUnixNano = t0.Add(2 * time.Minute).UnixNano()
	m.Apply([]sweep.DaemonResult{okResult("1", w1), hung}, t0.Add(2*time.Minute), 0)
	got = gather(t, reg)
	if diff := cmp.Diff(map[string]float64{lCgroup: 40 << 20}, pick(got, metricMemoryCurrent)); diff != "" {
		t.Errorf("sweep 3 memory (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{lCgroup: 2.8, lGuest: 1}, pick(got, metricCPUSeconds)); diff != "" {
		t.Errorf("sweep 3 cpu (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{`{code=DeadlineExceeded}`: 1}, pick(got, metricPollErrors)); diff != "" {
		t.Errorf("sweep 3 poll errors (-want +got):\n%s", diff)
	}

	// Sweep 4, 6 minutes later, past the grace period: w3's label set is
	// forgotten; w1 comes back in the same epoch within the accountant's
	// horizon, so it continues (100 ms charged, nothing twice), and its
	// label set's counter continues.
	w1 = proto.Clone(w1).(*sandboxstatsv1.WorkloadStatsSample)
	w1.CpuUsageUsec = proto.Uint64(400_000)
	m.Apply([]sweep.DaemonResult{okResult("1", w1)}, t0.Add(8*time.Minute), 0)
	got = gather(t, reg)
	if diff := cmp.Diff(map[string]float64{lCgroup: 2.9}, pick(got, metricCPUSeconds), approx()); diff != "" {
		t.Errorf("sweep 4 cpu (-want +got):\n%s", diff)
	}
	if _, ok := got[metricSampledWorkloads+lGuest]; ok {
		t.Errorf("vanished workload still in %s", metricSampledWorkloads)
	}
}

func approx() cmp.Option {
	return cmp.Comparer(func(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 })
}

func TestMetricsLabelActor(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]sweep.DaemonResult{
		okResult("1", sample("w1", 1, 100<<20)),
		okResult("2", sample("w2", 1, 50<<20)),
		okResult("3", sample("w1", 1, 999<<20)), // the same workload from a second daemon: neither believed
	}, time.Unix(0, 0), 0)
	want := map[string]float64{
		"{actor_name=w2-name,actor_namespace=team-a,actor_uid=w2,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 50 << 20,
	}
	got := gather(t, reg)
	if diff := cmp.Diff(want, pick(got, metricMemoryCurrent)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if n := got[metricActorConflicts+"{}"]; n != 1 {
		t.Errorf("%s = %v, want 1", metricActorConflicts, n)
	}
}

// TestDriftGaugePerKind: a sample that says it has open drift findings makes
// the sweep list them (a second call) and the agent export one gauge per kind.
func TestDriftGaugePerKind(t *testing.T) {
	d := statsdfake.Start(t, filepath.Join(t.TempDir(), "d.sock"))
	s := sample("actor-1", 1_000_000, 64<<20)
	s.OpenDriftFindings = 2
	d.Set(s)
	d.SetDrift(
		&sandboxstatsv1.DriftFinding{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, Subject: "/pod1", ActorUid: "actor-1"},
		&sandboxstatsv1.DriftFinding{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_STRAY_VMM, Subject: "pid 7", ActorUid: "actor-1"},
	)
	idle := statsdfake.Start(t, filepath.Join(t.TempDir(), "idle.sock"))
	idle.Set(sample("actor-2", 1, 1)) // no open findings: no second call

	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	results := sweep.PollAll(context.Background(), []string{d.Socket, idle.Socket}, 2, 5*time.Second)
	m.Apply(results, time.Now(), time.Millisecond)
	want := map[string]float64{
		"{kind=SANDBOX_DEAD,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 1,
		"{kind=STRAY_VMM,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}":    1,
	}
	if diff := cmp.Diff(want, pick(gather(t, reg), metricDriftFindings)); diff != "" {
		t.Errorf("drift gauge (-want +got):\n%s", diff)
	}
}

// TestDriftWithoutSamples: a workload that produces no sample (its agent
// silent: NOT_MEASURABLE_YET; its reads timing out or failing:
// DeadlineExceeded, Internal) still has its drift findings listed and
// exported, labelled with the kind and what the finding carries (actor_uid
// with LabelActor), the other workload labels empty. An idle daemon
// (NO_WORKLOAD), a refused call and a hung daemon (no time left) are not
// asked.
func TestDriftWithoutSamples(t *testing.T) {
	dir := t.TempDir()
	finding := func(kind sandboxstatsv1.DriftKind, actor string) *sandboxstatsv1.DriftFinding {
		return &sandboxstatsv1.DriftFinding{Kind: kind, Subject: "s-" + actor, ActorUid: actor}
	}
	silent := statsdfake.Start(t, filepath.Join(dir, "a-silent.sock"))
	silent.SetNoSample(sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET, "agent not answering")
	silent.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_AGENT_SILENT, "actor-1"))
	slow := statsdfake.Start(t, filepath.Join(dir, "b-slow.sock"))
	slow.SetError(status.Error(codes.DeadlineExceeded, "READ_TIMEOUT"))
	slow.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, "actor-2"))
	broken := statsdfake.Start(t, filepath.Join(dir, "c-internal.sock"))
	broken.SetError(status.Error(codes.Internal, "MALFORMED_SOURCE"))
	broken.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_VMM_GONE, "actor-3"))
	idle := statsdfake.Start(t, filepath.Join(dir, "d-idle.sock")) // NO_WORKLOAD
	idle.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_STRAY_VMM, "actor-4"))
	unavailable := statsdfake.Start(t, filepath.Join(dir, "e-unavailable.sock"))
	unavailable.SetError(status.Error(codes.Unavailable, "NOT_MEASURABLE"))
	unavailable.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_CGROUP_GONE, "actor-5"))
	hung := statsdfake.Start(t, filepath.Join(dir, "f-hung.sock"))
	hung.Hang()
	hung.SetDrift(finding(sandboxstatsv1.DriftKind_DRIFT_KIND_SENTRY_GONE, "actor-6"))

	results, err := sweep.Sweep(context.Background(), filepath.Join(dir, "*.sock"), 8, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, wantFindings := range []int{1, 1, 1, 0, 0, 0} {
		if r := results[i]; len(r.DriftFindings) != wantFindings {
			t.Errorf("%s: %d findings listed (drift err %v), want %d", filepath.Base(r.Socket), len(r.DriftFindings), r.DriftErr, wantFindings)
		}
	}
	if r := results[5]; r.Code != codes.DeadlineExceeded || r.DriftErr == nil {
		t.Errorf("hung daemon: code %s, drift err %v; want DeadlineExceeded and a drift error (no time left)", r.Code, r.DriftErr)
	}

	for _, tc := range []struct {
		labelActor bool
		want       map[string]float64
	}{
		{false, map[string]float64{
			"{kind=AGENT_SILENT,sandbox_class=,source=,template_name=,template_namespace=}": 1,
			"{kind=SANDBOX_DEAD,sandbox_class=,source=,template_name=,template_namespace=}": 1,
			"{kind=VMM_GONE,sandbox_class=,source=,template_name=,template_namespace=}":     1,
		}},
		{true, map[string]float64{
			"{actor_name=,actor_namespace=,actor_uid=actor-1,kind=AGENT_SILENT,sandbox_class=,source=,template_name=,template_namespace=}": 1,
			"{actor_name=,actor_namespace=,actor_uid=actor-2,kind=SANDBOX_DEAD,sandbox_class=,source=,template_name=,template_namespace=}": 1,
			"{actor_name=,actor_namespace=,actor_uid=actor-3,kind=VMM_GONE,sandbox_class=,source=,template_name=,template_namespace=}":     1,
		}},
	} {
		reg := prometheus.NewPedanticRegistry()
		m, err := newMetrics(reg, metricsConfig{LabelActor: tc.labelActor, Grace: time.Minute}, discard())
		if err != nil {
			t.Fatal(err)
		}
		m.Apply(results, time.Now(), time.Millisecond)
		if diff := cmp.Diff(tc.want, pick(gather(t, reg), metricDriftFindings)); diff != "" {
			t.Errorf("label actor %v: drift gauge (-want +got):\n%s", tc.labelActor, diff)
		}
	}
}

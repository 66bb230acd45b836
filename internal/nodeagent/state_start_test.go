package nodeagent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// cpuPoint is one actor's CPU counter: its start (OTLP's start time,
// Prometheus's created timestamp) and value (seconds).
type cpuPoint struct {
	Start time.Time
	Value float64
}

// otelCPUPoints returns container.cpu.time's points by actor uid
// (LabelActor), as the harness's reader collects them.
func otelCPUPoints(t *testing.T, h *otelHarness) map[string]cpuPoint {
	t.Helper()
	out := map[string]cpuPoint{}
	for _, sm := range h.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "container.cpu.time" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[float64]).DataPoints {
				actor, _ := p.Attributes.Value(attrActorUID)
				out[actor.AsString()] = cpuPoint{Start: p.StartTime, Value: p.Value}
			}
		}
	}
	return out
}

// promCPUPoints returns sandboxstats_workload_cpu_seconds_total's series
// by actor uid, with their created timestamps.
func promCPUPoints(t *testing.T, h *otelHarness) map[string]cpuPoint {
	t.Helper()
	fams, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cpuPoint{}
	for _, f := range fams {
		if f.GetName() != metricCPUSeconds {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "actor_uid" {
					out[l.GetValue()] = cpuPoint{Start: m.GetCounter().GetCreatedTimestamp().AsTime(), Value: m.GetCounter().GetValue()}
				}
			}
		}
	}
	return out
}

// checkCPUPoints holds h's CPU counters, over OTLP and Prometheus, to want.
func checkCPUPoints(t *testing.T, h *otelHarness, when string, want map[string]cpuPoint) {
	t.Helper()
	approx := cmpopts.EquateApprox(0, 1e-9)
	if diff := cmp.Diff(want, otelCPUPoints(t, h), approx); diff != "" {
		t.Errorf("%s: container.cpu.time (-want +got):\n%s", when, diff)
	}
	if diff := cmp.Diff(want, promCPUPoints(t, h), approx); diff != "" {
		t.Errorf("%s: %s, created timestamps (-want +got):\n%s", when, metricCPUSeconds, diff)
	}
}

// TestCounterStartAcrossRestart: over OTLP a counter's start time marks a
// reset (a consumer trusting start times, cumulativetodelta for one, takes
// a point with a new start as counted from zero: the SDK's observable
// counters gave every point the process's start). A counter the restarted
// agent continues from its state keeps the start its label set was first
// charged at; a label set first charged after the restart starts then; a
// label set forgotten after the grace period (here while the agent was
// up, then restarted) starts again when it is back, from zero. The
// Prometheus counters carry the same start as their created timestamp.
func TestCounterStartAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	sec := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	a := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		return signalSample("a", sec(1), at, cpu)
	}
	b := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		return signalSample("b", sec(2), at, cpu)
	}
	sweepAt := func(h *statefulHarness, at time.Time, s ...*sandboxstatsv1.WorkloadStatsSample) {
		h.m.Apply([]sweep.DaemonResult{okResult("s", s...)}, at, time.Millisecond)
	}

	first := newStatefulHarness(t, dir, t0)
	sweepAt(first, sec(10), a(sec(10), 1_000_000), b(sec(10), 400_000))
	sweepAt(first, sec(20), a(sec(20), 2_000_000), b(sec(20), 500_000))
	checkCPUPoints(t, first.otelHarness, "before the restart: each series starts at its first charge",
		map[string]cpuPoint{"a": {sec(10), 2}, "b": {sec(10), 0.5}})

	second := newStatefulHarness(t, dir, sec(60))
	c := signalSample("c", sec(65), sec(70), 300_000)
	sweepAt(second, sec(70), a(sec(70), 5_000_000), c) // b not sampled from 0:20 on
	checkCPUPoints(t, second.otelHarness, "after the restart: a continued keeps its start, c new starts at its first charge",
		map[string]cpuPoint{"a": {sec(10), 5}, "b": {sec(10), 0.5}, "c": {sec(70), 0.3}})
	sweepAt(second, sec(400), a(sec(400), 6_000_000)) // b forgotten: unseen past the 5 min grace

	third := newStatefulHarness(t, dir, sec(420))
	sweepAt(third, sec(430), a(sec(430), 6_500_000), b(sec(430), 800_000))
	checkCPUPoints(t, third.otelHarness, "b back after the grace period: a new series, from zero (its growth since last charged), its own start",
		map[string]cpuPoint{"a": {sec(10), 6.5}, "b": {sec(430), 0.3}})
}

// TestCounterStartOlderState: a state file without the counters' starts
// (written before they were kept) starts their series at the restart, as
// a first start would: the value continues, OTLP sees one reset.
func TestCounterStartOlderState(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	first := newStatefulHarness(t, dir, t0)
	first.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", t0, t0.Add(10*time.Second), 1_000_000))}, t0.Add(10*time.Second), time.Millisecond)

	p := filepath.Join(dir, agentStateFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	for _, ts := range st["totals"].([]any) {
		delete(ts.(map[string]any), "start_unix_nano")
	}
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}

	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	second.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", t0, t0.Add(70*time.Second), 3_000_000))}, t0.Add(70*time.Second), time.Millisecond)
	checkCPUPoints(t, second.otelHarness, "continued from a state without starts", map[string]cpuPoint{"a": {t0.Add(time.Minute), 3}})
}

// TestCounterOverflow: past the cardinality limit the newest label sets'
// points of a counter are summed into one overflow point (as the SDK's
// limit does), which starts at the earliest of theirs.
func TestCounterOverflow(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	snap := &snapshot{counters: map[labelSet]*counterValues{}}
	for i, actor := range []string{"d", "c", "b", "a"} { // a is the oldest
		cv := &counterValues{start: t0.Add(-time.Duration(i) * time.Second)}
		cv.has[rate.CounterCPU], cv.total[rate.CounterCPU] = true, uint64(i+1)*1_000_000
		snap.counters[labelSet{class: "runsc", source: "cgroup", actorUID: actor}] = cv
	}
	type point struct {
		Actor    string
		Overflow bool
		Start    time.Time
		Value    float64
	}
	ms, _ := counters(snap, true, 3, t0.Add(time.Minute), nil)
	var got []point
	for _, m := range ms {
		if m.Name != "container.cpu.time" {
			t.Errorf("metric %s: only CPU was charged", m.Name)
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[float64]).DataPoints {
			actor, _ := p.Attributes.Value(attrActorUID)
			got = append(got, point{actor.AsString(), p.Attributes.HasValue("otel.metric.overflow"), p.StartTime, p.Value})
		}
	}
	want := []point{{"a", false, t0.Add(-3 * time.Second), 4}, {"b", false, t0.Add(-2 * time.Second), 3},
		{"", true, t0.Add(-time.Second), 3}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("limit 3: two points and the overflow (-want +got):\n%s", diff)
	}
}

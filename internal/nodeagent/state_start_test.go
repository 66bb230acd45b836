package nodeagent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// cpuPoint is one actor's container.cpu.time point: its start and value.
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

// TestOTLPStartAcrossRestart: over OTLP a counter's start time marks a
// reset (a consumer trusting start times, cumulativetodelta for one, takes
// a point with a new start as counted from zero). A counter the restarted
// agent continues from its state keeps the start its label set was first
// charged at; a label set first charged after the restart starts then.
func TestOTLPStartAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	a := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		return signalSample("a", t0.Add(time.Second), at, cpu)
	}
	first := newStatefulHarness(t, dir, t0)
	first.m.Apply([]sweep.DaemonResult{okResult("s", a(t0.Add(10*time.Second), 1_000_000))}, t0.Add(10*time.Second), time.Millisecond)
	first.m.Apply([]sweep.DaemonResult{okResult("s", a(t0.Add(20*time.Second), 2_000_000))}, t0.Add(20*time.Second), time.Millisecond)
	before := otelCPUPoints(t, first.otelHarness)

	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	c := signalSample("c", t0.Add(65*time.Second), t0.Add(70*time.Second), 300_000)
	second.m.Apply([]sweep.DaemonResult{okResult("s", a(t0.Add(70*time.Second), 5_000_000), c)}, t0.Add(70*time.Second), time.Millisecond)
	after := otelCPUPoints(t, second.otelHarness)

	approx := cmpopts.EquateApprox(0, 1e-9)
	if diff := cmp.Diff(map[string]cpuPoint{"a": {t0.Add(10 * time.Second), 2}}, before, approx); diff != "" {
		t.Errorf("before the restart: a's series starts at its first charge (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]cpuPoint{"a": {t0.Add(10 * time.Second), 5}, "c": {t0.Add(70 * time.Second), 0.3}}, after, approx); diff != "" {
		t.Errorf("after the restart: a continued keeps its start, c new starts at its first charge (-want +got):\n%s", diff)
	}
}

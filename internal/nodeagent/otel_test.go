package nodeagent

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// eventSummary is one usage event as a test compares it.
type eventSummary struct {
	Kind, Actor string
	CPU         float64 // sandboxstats.stats.cpu.time, -1 when absent
	Charged     float64 // finals: sandboxstats.activation.charged_cpu_time
}

func summarize(h *otelHarness) []eventSummary {
	var out []eventSummary
	for _, r := range h.events.records() {
		e := eventSummary{CPU: -1}
		r.WalkAttributes(func(kv attribute.KeyValue) bool {
			switch kv.Key {
			case attrKind:
				e.Kind = kv.Value.AsString()
			case attrActorUID:
				e.Actor = kv.Value.AsString()
			case attrCPUTime:
				e.CPU = kv.Value.AsFloat64()
			case attrCharged:
				e.Charged = kv.Value.AsFloat64()
			}
			return true
		})
		out = append(out, e)
	}
	return out
}

// otelCPU returns container.cpu.time's values by actor uid (LabelActor).
func otelCPU(t *testing.T, h *otelHarness) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for actor, p := range otelCPUPoints(t, h) {
		out[actor] = p.Value
	}
	return out
}

// TestUsageEvents: one initial event per activation at its first sample,
// periodic ones at every Nth sweep, one final per ended activation however
// often statsd serves its record; the OTLP CPU counter equals the
// Prometheus one (head and tail charged alike) and the activations' own
// CPU.
func TestUsageEvents(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	h := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2, LabelActor: true}, 2)
	epoch := t0.Add(time.Second)
	at := func(actor string, sec int, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		s := signalSample(actor, epoch, t0.Add(time.Duration(sec)*time.Second), cpu)
		return s
	}
	ended := endedOf(at("a", 40, 3_000_000), t0.Add(40*time.Second), 3_000_000)
	sweeps := [][]sweep.DaemonResult{
		{okResult("s", at("a", 10, 1_000_000), at("b", 10, 500_000))},
		{okResult("s", at("a", 20, 2_000_000), at("b", 20, 1_000_000))}, // periodic (the 2nd sweep)
		{{Socket: "s", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{at("b", 40, 1_500_000)}, Ended: []*sandboxstatsv1.EndedActivation{ended}}},
		{{Socket: "s", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{at("b", 50, 2_000_000)}, Ended: []*sandboxstatsv1.EndedActivation{ended}}}, // periodic; the record again
	}
	for i, r := range sweeps {
		h.m.Apply(r, t0.Add(time.Duration(10*(i+1))*time.Second), time.Millisecond)
	}
	want := []eventSummary{
		{Kind: KindInitial, Actor: "a", CPU: 1}, {Kind: KindInitial, Actor: "b", CPU: 0.5},
		{Kind: KindPeriodic, Actor: "a", CPU: 2}, {Kind: KindPeriodic, Actor: "b", CPU: 1},
		{Kind: KindFinal, Actor: "a", CPU: 3, Charged: 1},
		{Kind: KindPeriodic, Actor: "b", CPU: 2},
	}
	if diff := cmp.Diff(want, summarize(h)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	gotOTel := otelCPU(t, h)
	prom := pick(gather(t, h.reg), metricCPUSeconds)
	if diff := cmp.Diff(map[string]float64{"a": 3, "b": 2}, gotOTel, cmp.Comparer(func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })); diff != "" {
		t.Errorf("container.cpu.time by actor (-want +got):\n%s", diff)
	}
	var promSum float64
	for _, v := range prom {
		promSum += v
	}
	if math.Abs(promSum-5) > 1e-9 {
		t.Errorf("Prometheus CPU %v s in all, OTLP %v", promSum, gotOTel)
	}
}

// TestPeriodicOff: with periodic events off, an activation sends its
// initial event only.
func TestPeriodicOff(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	h := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2}, 0)
	for i := range 3 {
		s := signalSample("a", t0.Add(time.Second), t0.Add(time.Duration(10*(i+1))*time.Second), uint64(i+1)*1_000_000)
		h.m.Apply([]sweep.DaemonResult{okResult("s", s)}, t0.Add(time.Duration(10*(i+1))*time.Second), time.Millisecond)
	}
	if diff := cmp.Diff([]eventSummary{{Kind: KindInitial, Actor: "a", CPU: 1}}, summarize(h)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestFinalNotResentAfterRestart: an agent that restarts while statsd still
// serves an ended record (within --ended-retention) does not send its final
// again: the record ended before the new agent started. A record that ends
// after the restart gets its one final from the new agent.
func TestFinalNotResentAfterRestart(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	epoch := t0.Add(time.Second)
	s := signalSample("a", epoch, t0.Add(10*time.Second), 1_000_000)
	ended := endedOf(s, t0.Add(20*time.Second), 2_000_000)
	first := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2}, 0)
	first.m.Apply([]sweep.DaemonResult{okResult("s", s)}, t0.Add(10*time.Second), time.Millisecond)
	first.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{ended}}}, t0.Add(30*time.Second), time.Millisecond)

	restarted := t0.Add(40 * time.Second)
	second := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: restarted, CPUs: 2}, 0)
	later := endedOf(signalSample("b", epoch, t0.Add(10*time.Second), 1_000_000), t0.Add(50*time.Second), 3_000_000)
	second.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{ended, later}}}, t0.Add(60*time.Second), time.Millisecond)

	all := append(summarize(first), summarize(second)...)
	want := []eventSummary{{Kind: KindInitial, Actor: "a", CPU: 1}, {Kind: KindFinal, Actor: "a", CPU: 2, Charged: 1},
		{Kind: KindFinal, Actor: "b", CPU: 3}}
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("events across the restart (-want +got):\n%s", diff)
	}
}

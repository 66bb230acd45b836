package nodeagent

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// promTemplates returns the template_name values of reg's series and how
// many series reg exports (a histogram's buckets, sum and count each one,
// as a scrape's lines).
func promTemplates(t *testing.T, reg prometheus.Gatherer) (templates map[string]bool, series int) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	templates = map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			series++
			if h := m.GetHistogram(); h != nil {
				series += len(h.GetBucket()) + 2
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "template_name" {
					templates[l.GetValue()] = true
				}
			}
		}
	}
	return templates, series
}

// otelTemplates returns the sandboxstats.template.name values of h's
// points, how many points it collects, and the sum of the named counter's
// points.
func otelTemplates(t *testing.T, h *otelHarness, counter string) (templates map[string]bool, points int, sum int64) {
	t.Helper()
	templates = map[string]bool{}
	for _, sm := range h.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			_, sets := instrumentOf(m)
			for _, set := range sets {
				if v, ok := set.Value(attrTemplateName); ok {
					templates[v.AsString()] = true
				}
			}
			points += len(sets)
			if m.Name == counter {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					sum += p.Value
				}
			}
		}
	}
	return templates, points, sum
}

// freshTemplates returns the ended records of n activations from first on,
// each of a template of its own, that ran a minute up to now with 1 s of
// CPU, never sampled.
func freshTemplates(first, n int, now time.Time) []*sandboxstatsv1.EndedActivation {
	var out []*sandboxstatsv1.EndedActivation
	for k := first; k < first+n; k++ {
		s := sample(fmt.Sprintf("a%05d", k), 0, 32<<20)
		s.TemplateName = fmt.Sprintf("tenant-%05d", k)
		s.EpochUnixNano = now.Add(-time.Minute).UnixNano()
		out = append(out, endedOf(s, now.Add(-time.Second), 1_000_000))
	}
	return out
}

// TestTemplateSeriesBounded: 4000 activations, each of a template of its
// own (a tenant names them), leave at most DefaultMaxTemplates templates
// and (other) in the Prometheus and the OTLP export, every activation
// counted whole, the folds counted; past the ended horizon (and the grace
// period) no template series is left, in either, and a new template has
// its name again.
func TestTemplateSeriesBounded(t *testing.T) {
	const (
		activations = 4000
		perSweep    = 100
		grace       = 5 * time.Minute
		horizon     = 10 * time.Minute
	)
	t0 := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	h := newOTelHarness(t, metricsConfig{Grace: grace, EndedHorizon: horizon, Started: t0}, 0)
	now := t0.Add(2 * time.Minute) // the activations began after the agent started: each charged whole
	for first := 0; first < activations; first += perSweep {
		now = now.Add(5 * time.Second)
		h.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: freshTemplates(first, perSweep, now)}}, now, time.Millisecond)
	}

	tmpls, series := promTemplates(t, h.reg)
	otelTmpls, points, otelEnded := otelTemplates(t, h, "sandboxstats.activations.ended")
	t.Logf("after %d activations of fresh templates: Prometheus %d templates, %d series; OTLP %d templates, %d points",
		activations, len(tmpls), series, len(otelTmpls), points)
	if len(tmpls) > DefaultMaxTemplates+1 || len(otelTmpls) > DefaultMaxTemplates+1 {
		t.Errorf("templates exported: Prometheus %d, OTLP %d; want at most %d (the cap and (other))", len(tmpls), len(otelTmpls), DefaultMaxTemplates+1)
	}
	all := gather(t, h.reg)
	got := map[string]float64{
		"ended":   sumFamily(t, h.reg, metricActivationsEnded),
		"cpu":     sumFamily(t, h.reg, metricCPUSeconds),
		"cpu_sum": sumPicked(pick(all, metricActivationCPU+"_sum")),
		"otel":    float64(otelEnded),
	}
	want := map[string]float64{"ended": activations, "cpu": activations, "cpu_sum": activations, "otel": activations}
	if diff := cmp.Diff(want, got, approx()); diff != "" {
		t.Errorf("activations and their CPU, summed over the templates (-want +got):\n%s", diff)
	}
	if got, want := sumFamily(t, h.reg, metricTemplatesFolded), float64(activations-DefaultMaxTemplates); got != want {
		t.Errorf("%s = %v, want %v", metricTemplatesFolded, got, want)
	}

	// Past the ended horizon and the grace period: nothing of them is left.
	now = now.Add(horizon + time.Second)
	h.m.Apply(nil, now, time.Millisecond)
	tmpls, series = promTemplates(t, h.reg)
	otelTmpls, points, _ = otelTemplates(t, h, "")
	t.Logf("past the horizon: Prometheus %d templates, %d series; OTLP %d templates, %d points", len(tmpls), series, len(otelTmpls), points)
	if len(tmpls) != 0 || len(otelTmpls) != 0 {
		t.Errorf("past the horizon: templates exported: Prometheus %d, OTLP %d; want none", len(tmpls), len(otelTmpls))
	}

	// The slots are free: a new template is exported by its name.
	now = now.Add(5 * time.Second)
	h.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: freshTemplates(activations, 1, now)}}, now, time.Millisecond)
	tmpls, _ = promTemplates(t, h.reg)
	if name := fmt.Sprintf("tenant-%05d", activations); len(tmpls) != 1 || !tmpls[name] {
		t.Errorf("a new template after the horizon: %d templates exported, %s among them: %v; want it alone", len(tmpls), name, tmpls[name])
	}
}

func sumPicked(series map[string]float64) float64 {
	var sum float64
	for _, v := range series {
		sum += v
	}
	return sum
}

// TestOTelCardinalityLimitKeepsWorkloads: the SDK's cardinality limit
// (OTelCardinalityLimit, as the pipeline sets it) folds none of 1000
// workloads' series with LabelActor, each of a template of its own (the
// agent folds the templates past the cap; the actors stay apart).
func TestOTelCardinalityLimitKeepsWorkloads(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)
	h := newOTelHarness(t, metricsConfig{Grace: time.Hour, Started: t0.Add(-time.Hour), CPUs: 2, LabelActor: true}, 0)
	results := benchResults(benchDaemons, t0)
	for i, r := range results {
		r.Samples[0].TemplateName = fmt.Sprintf("fresh-%04d", i)
	}
	h.m.Apply(results, t0, time.Millisecond)
	advance(results, t0.Add(time.Minute))
	h.m.Apply(results, t0.Add(time.Minute), time.Millisecond)
	overflow, most := 0, 0
	for _, sm := range h.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			_, sets := instrumentOf(m)
			most = max(most, len(sets))
			for _, set := range sets {
				if set.HasValue("otel.metric.overflow") {
					overflow++
				}
			}
		}
	}
	t.Logf("limit %d: at most %d points of one instrument, %d overflow points", OTelCardinalityLimit(0), most, overflow)
	if overflow != 0 || most < 2*benchDaemons {
		t.Errorf("%d overflow points, at most %d points of one instrument; want none, and %d (1000 workloads x 2 directions)", overflow, most, 2*benchDaemons)
	}
}

package nodeagent

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Bucket bounds of the per-activation distributions, the same in the
// Prometheus histograms and the OTel ones.
var (
	cpuBounds      = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600}          // seconds
	durationBounds = []float64{1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600}          // seconds
	peakBounds     = []float64{16 << 20, 32 << 20, 64 << 20, 128 << 20, 256 << 20, 512 << 20, 1 << 30, 2 << 30, // bytes:
		4 << 30, 8 << 30, 16 << 30, 32 << 30, 64 << 30} // 16 MiB .. 64 GiB
)

// dist is one template label set's distribution of a per-activation
// value, as a cumulative OTel histogram point: counts by bucket of bounds
// (the last one past them), sum and extremes.
type dist[N int64 | float64] struct {
	count    uint64
	sum      N
	min, max N
	buckets  []uint64
}

// record adds v, bucketed by bounds (a bucket holds the values up to its
// bound, as OTel's and Prometheus's do).
func (d *dist[N]) record(v N, bounds []float64) {
	if d.buckets == nil {
		d.buckets = make([]uint64, len(bounds)+1)
	}
	d.buckets[sort.SearchFloat64s(bounds, float64(v))]++
	if d.count == 0 || v < d.min {
		d.min = v
	}
	if d.count == 0 || v > d.max {
		d.max = v
	}
	d.count++
	d.sum += v
}

func (d dist[N]) clone() dist[N] {
	d.buckets = slices.Clone(d.buckets)
	return d
}

func (d *dist[N]) point(set attribute.Set, start, now time.Time, bounds []float64) metricdata.HistogramDataPoint[N] {
	return metricdata.HistogramDataPoint[N]{
		Attributes: set, StartTime: start, Time: now,
		Count: d.count, Bounds: bounds, BucketCounts: slices.Clone(d.buckets),
		Min: metricdata.NewExtrema(d.min), Max: metricdata.NewExtrema(d.max), Sum: d.sum,
	}
}

// Distributions exports the per-activation distributions
// (sandboxstats.activation.cpu.time, .duration, .memory.peak) and the
// workload counters (otelCounters) over OTel: a sdkmetric.Producer for the
// reader of OTel.Meters' provider (otlp.Config.Producer). The SDK's
// synchronous histograms would keep every template's point for ever, and
// its observable counters give every point the instrument's creation as
// start time (a reset to OTLP after every restart); these are the agent's
// own: the distributions leave with the template's per-activation series
// (pruneActivations), each counter point starts at its label set's first
// charge (otel_counters.go). Made before the metrics, so that the reader
// can be; newMetrics binds it.
type Distributions struct {
	m atomic.Pointer[metrics]

	mu    sync.Mutex
	attrs map[labelSet]*counterAttrs // of the counters' last production
}

// NewDistributions returns Distributions to pass to the OTLP pipeline's
// reader and as OTel.Distributions.
func NewDistributions() *Distributions { return &Distributions{} }

// Produce implements sdkmetric.Producer over the latest snapshot.
func (d *Distributions) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	m := d.m.Load()
	if m == nil {
		return nil, nil
	}
	snap := m.snap.Load()
	now := time.Now()
	d.mu.Lock()
	out, attrs := counters(snap, m.cfg.LabelActor, OTelCardinalityLimit(m.cfg.MaxTemplates), now, d.attrs)
	d.attrs = attrs
	d.mu.Unlock()
	if ctr, ok := containerCounters(snap, m.cfg.LabelActor, OTelContainerCardinalityLimit(m.cfg.MaxTemplates, m.cfg.MaxContainers), now); ok {
		out = append(out, ctr)
	}
	cpu := metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
	duration := metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
	peak := metricdata.Histogram[int64]{Temporality: metricdata.CumulativeTemporality}
	for l, ac := range snap.activations {
		set := attribute.NewSet(workloadAttrs(l, false)...)
		if ac.cpu.count > 0 {
			cpu.DataPoints = append(cpu.DataPoints, ac.cpu.point(set, ac.start, now, cpuBounds))
		}
		if ac.duration.count > 0 {
			duration.DataPoints = append(duration.DataPoints, ac.duration.point(set, ac.start, now, durationBounds))
		}
		if ac.peak.count > 0 {
			peak.DataPoints = append(peak.DataPoints, ac.peak.point(set, ac.start, now, peakBounds))
		}
	}
	if len(cpu.DataPoints) > 0 {
		out = append(out, metricdata.Metrics{Name: "sandboxstats.activation.cpu.time", Unit: "s",
			Description: "CPU time of each ended activation (its own: final minus the epoch baseline).", Data: cpu})
	}
	if len(duration.DataPoints) > 0 {
		out = append(out, metricdata.Metrics{Name: "sandboxstats.activation.duration", Unit: "s",
			Description: "Wall time of each ended activation, from its Run/Restore to its end.", Data: duration})
	}
	if len(peak.DataPoints) > 0 {
		out = append(out, metricdata.Metrics{Name: "sandboxstats.activation.memory.peak", Unit: "By",
			Description: "Peak memory of each ended activation (the source's peak within the epoch).", Data: peak})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: otelScope}, Metrics: out}}, nil
}

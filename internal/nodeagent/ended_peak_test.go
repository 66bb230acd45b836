package nodeagent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// peakBuckets returns the activation peak histogram of the cgroup label set
// as its cumulative bucket counts by upper bound (MiB; +Inf as -1), plus
// its count and sum.
func peakBuckets(t *testing.T, reg prometheus.Gatherer) (buckets map[float64]uint64, count uint64, sum float64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != metricActivationPeak {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("%s has %d series, want the one template's", metricActivationPeak, len(f.GetMetric()))
		}
		h := f.GetMetric()[0].GetHistogram()
		buckets = map[float64]uint64{}
		for _, b := range h.GetBucket() {
			buckets[b.GetUpperBound()/(1<<20)] = b.GetCumulativeCount()
		}
		return buckets, h.GetSampleCount(), h.GetSampleSum()
	}
	return nil, 0, 0
}

// TestActivationPeakHistogram: an ended activation's peak goes into
// sandboxstats_activation_memory_peak_bytes (16 MiB to 64 GiB buckets) when
// the source measured it; a lower bound (the source offers no peak) or an
// absent peak is left out of it and counted in
// sandboxstats_activation_memory_peak_missing_total{reason}; a record
// served in every sweep counts once.
func TestActivationPeakHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0}, discard())
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(time.Minute)
	small := endedOf(sample("small", 0, 50<<20), end, 1_000_000) // peak 100 MiB
	large := endedOf(sample("large", 0, 10<<30), end, 2_000_000) // peak 20 GiB
	huge := endedOf(sample("huge", 0, 50<<30), end, 3_000_000)   // peak 100 GiB: over the last bucket
	lower := endedOf(sample("lower", 0, 20<<20), end, 500_000)
	lower.MemoryPeakBytes, lower.MemoryPeakIsLowerBound = proto.Uint64(300<<20), true
	absent := endedOf(sample("absent", 0, 20<<20), end, 250_000)
	absent.MemoryPeakBytes = nil
	idle := sweep.DaemonResult{Socket: "1", Status: sweep.StatusNoSample,
		Ended: []*sandboxstatsv1.EndedActivation{small, large, huge, lower, absent}}
	for i := range 3 { // served three sweeps in a row: counted once
		m.Apply([]sweep.DaemonResult{idle}, end.Add(time.Duration(i+1)*time.Minute), 0)
	}

	buckets, count, sum := peakBuckets(t, reg)
	const mib = 1 << 20
	wantBuckets := map[float64]uint64{16: 0, 32: 0, 64: 0, 128: 1, 256: 1, 512: 1, 1024: 1, 2048: 1, 4096: 1, 8192: 1, 16384: 1, 32768: 2, 65536: 2}
	if diff := cmp.Diff(wantBuckets, buckets); diff != "" {
		t.Errorf("cumulative peak buckets by MiB (-want +got):\n%s", diff)
	}
	if want := float64(100*mib + 20<<30 + 100<<30); count != 3 || sum != want {
		t.Errorf("peak histogram: count %d, sum %v; want 3 (the measured peaks only) and %v", count, sum, want)
	}
	missing := pick(gather(t, reg), metricActivationNoPeak)
	wantMissing := map[string]float64{
		"{reason=absent,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}":      1,
		"{reason=lower-bound,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 1,
	}
	if diff := cmp.Diff(wantMissing, missing); diff != "" {
		t.Errorf("%s (-want +got):\n%s", metricActivationNoPeak, diff)
	}
}

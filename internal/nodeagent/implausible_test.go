package nodeagent

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// TestImplausibleNeighbour: one workload reporting a CPU counter at 2^64-1
// charges nothing (counted) and leaves its template's shared series to its
// neighbour, whose later CPU is still charged.
func TestImplausibleNeighbour(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 4}, discard())
	if err != nil {
		t.Fatal(err)
	}
	sweepAt := func(i int, hostile, neighbour uint64) {
		h, n := sample("hostile", hostile, 10<<20), sample("neighbour", neighbour, 10<<20)
		m.Apply([]sweep.DaemonResult{okResult("1", h), okResult("2", n)}, t0.Add(time.Duration(i)*time.Minute), 0)
	}
	sweepAt(0, 1_000_000, 1_000_000)      // first sight: nothing
	sweepAt(1, math.MaxUint64, 2_000_000) // neighbour +1 s; hostile absurd
	sweepAt(2, math.MaxUint64, 5_000_000) // neighbour +3 s
	got := gather(t, reg)
	if diff := cmp.Diff(map[string]float64{lCgroup: 4}, pick(got, metricCPUSeconds), approx()); diff != "" {
		t.Errorf("the template's CPU (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"{reason=absurd}": 2, "{reason=growth}": 0}, pick(got, metricImplausibleSamples)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", metricImplausibleSamples, diff)
	}
}

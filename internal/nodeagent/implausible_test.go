package nodeagent

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
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
	if diff := cmp.Diff(map[string]float64{"{reason=absurd}": 2, "{reason=growth}": 0, "{reason=overflow}": 0}, pick(got, metricImplausibleSamples)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", metricImplausibleSamples, diff)
	}
}

// TestImplausibleNeighbourNetwork: a workload whose network counter cycles
// 2^62-1 -> 0 -> 2^62-1 (below the absurd value; a reset every other
// sweep) adds nothing to its template's shared series (each 2^62 growth in
// a minute is past 2^40 bytes a second, refused and counted), so the
// series never saturates and its neighbour's bytes are charged whole.
func TestImplausibleNeighbourNetwork(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 4}, discard())
	if err != nil {
		t.Fatal(err)
	}
	withTx := func(s *sandboxstatsv1.WorkloadStatsSample, tx uint64) *sandboxstatsv1.WorkloadStatsSample {
		s.Network = &sandboxstatsv1.NetworkStats{Total: &sandboxstatsv1.InterfaceCounters{Name: "total", TxBytes: tx}}
		return s
	}
	const sweeps = 20
	for i := range sweeps {
		hostile := uint64(1<<62 - 1)
		if i%2 == 1 {
			hostile = 0
		}
		h := withTx(sample("hostile", 1_000_000, 10<<20), hostile)
		n := withTx(sample("neighbour", 1_000_000, 10<<20), uint64(i)<<20) // 1 MiB a minute
		m.Apply([]sweep.DaemonResult{okResult("1", h), okResult("2", n)}, t0.Add(time.Duration(i)*time.Minute), 0)
	}
	got := gather(t, reg)
	txMetric := counterMetrics[rate.CounterNetTxBytes].name
	if diff := cmp.Diff(map[string]float64{lCgroup: (sweeps - 1) << 20}, pick(got, txMetric)); diff != "" {
		t.Errorf("the template's transmitted bytes: the neighbour's %d MiB (-want +got):\n%s", sweeps-1, diff)
	}
	if n := got[metricImplausibleSamples+"{reason=growth}"]; n != sweeps/2-1 {
		t.Errorf("%s{reason=growth} = %v, want %d (each climb back to 2^62-1)", metricImplausibleSamples, n, sweeps/2-1)
	}
}

// TestChargeNeverOverflows: a charge that would make a shared total
// overflow is refused (counted reason overflow), never saturated: the
// total keeps what it had, and later charges that fit are still added.
func TestChargeNeverOverflows(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, CPUs: 4}, discard())
	if err != nil {
		t.Fatal(err)
	}
	l := labelSet{templateName: "t"}
	tx := rate.CounterID{Counter: rate.CounterNetTxBytes}
	now := time.Now()
	m.charge(l, rate.Charges{{ID: tx, Value: math.MaxUint64 - 10}}, now)
	m.charge(l, rate.Charges{{ID: tx, Value: 20}}, now)
	m.charge(l, rate.Charges{{ID: tx, Value: 5}}, now)
	if got := m.totals[l].values.total[rate.CounterNetTxBytes]; got != math.MaxUint64-5 {
		t.Errorf("total = %d, want %d (the overflowing 20 refused, the 5 added)", got, uint64(math.MaxUint64-5))
	}
	if n := gather(t, reg)[metricImplausibleSamples+"{reason=overflow}"]; n != 1 {
		t.Errorf("%s{reason=overflow} = %v, want 1", metricImplausibleSamples, n)
	}
}

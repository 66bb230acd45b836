package nodeagent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// signalSample is actor's sample in an epoch begun at epoch, observed at
// at, with every signal and traffic part set from v (a counter's value) and
// a 64 MiB limit.
func signalSample(actor string, epoch, at time.Time, v uint64) *sandboxstatsv1.WorkloadStatsSample {
	s := sample(actor, v, 64<<20)
	s.EpochUnixNano, s.ObservedAtUnixNano = epoch.UnixNano(), at.UnixNano()
	s.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START, ObservedAtUnixNano: epoch.UnixNano()}
	s.MemorySignals = &sandboxstatsv1.MemorySignals{LimitBytes: &sandboxstatsv1.Limit{Value: 64 << 20}, OomKills: proto.Uint64(v / 1_000_000)}
	s.CpuThrottling = &sandboxstatsv1.CpuThrottling{Periods: proto.Uint64(v / 100_000), ThrottledPeriods: proto.Uint64(v / 200_000),
		ThrottledUsec: proto.Uint64(v / 2), QuotaUsec: &sandboxstatsv1.Limit{Value: 20_000}, PeriodUsec: proto.Uint64(100_000)}
	s.Pressure = &sandboxstatsv1.Pressure{Cpu: &sandboxstatsv1.PressureStall{SomeUsec: proto.Uint64(v / 4)}}
	s.Pids = &sandboxstatsv1.Pids{Current: 3, Limit: &sandboxstatsv1.Limit{Unlimited: true}}
	s.Network = &sandboxstatsv1.NetworkStats{Layer: sandboxstatsv1.NetworkLayer_NETWORK_LAYER_HOST_NAMESPACE,
		Total: &sandboxstatsv1.InterfaceCounters{Name: "total", RxBytes: v, TxBytes: 2 * v, RxPackets: v / 1000, TxPackets: v / 500},
		Interfaces: []*sandboxstatsv1.InterfaceCounters{
			{Name: "eth0", RxBytes: v - v/4, TxBytes: 2*v - v/2},
			{Name: "eth1", RxBytes: v / 4, TxBytes: v / 2},
		},
		Loopback: &sandboxstatsv1.InterfaceCounters{Name: "lo", RxBytes: 1 << 40, TxBytes: 1 << 40}}
	s.BlockIo = &sandboxstatsv1.BlockIo{WriteBytes: 64 * v, WriteIos: v / 8000}
	return s
}

// TestSignalMetrics: two sweeps of one workload that started after the
// agent: every counter charged from the epoch start (the first sweep) and
// then by deltas; loopback never in the network counters; the limit and
// pids gauges.
func TestSignalMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2}, discard())
	if err != nil {
		t.Fatal(err)
	}
	epoch := t0.Add(10 * time.Second)
	m.Apply([]sweep.DaemonResult{okResult("1", signalSample("w1", epoch, t0.Add(20*time.Second), 4_000_000))}, t0.Add(20*time.Second), 0)
	m.Apply([]sweep.DaemonResult{okResult("1", signalSample("w1", epoch, t0.Add(80*time.Second), 10_000_000))}, t0.Add(80*time.Second), 0)
	got := gather(t, reg)
	want := map[string]float64{
		"sandboxstats_workload_cpu_seconds_total":                     10,
		"sandboxstats_workload_oom_kills_total":                       10,
		"sandboxstats_workload_cpu_periods_total":                     100,
		"sandboxstats_workload_cpu_throttled_periods_total":           50,
		"sandboxstats_workload_cpu_throttled_seconds_total":           5,
		"sandboxstats_workload_pressure_cpu_waiting_seconds_total":    2.5,
		"sandboxstats_workload_network_receive_bytes_total":           10_000_000,
		"sandboxstats_workload_network_transmit_bytes_total":          20_000_000,
		"sandboxstats_workload_network_receive_packets_total":         10_000,
		"sandboxstats_workload_network_transmit_packets_total":        20_000,
		"sandboxstats_workload_network_receive_errors_total":          0,
		"sandboxstats_workload_network_transmit_errors_total":         0,
		"sandboxstats_workload_network_receive_dropped_total":         0,
		"sandboxstats_workload_network_transmit_dropped_total":        0,
		"sandboxstats_workload_io_write_bytes_total":                  640_000_000,
		"sandboxstats_workload_io_read_bytes_total":                   0,
		"sandboxstats_workload_io_write_operations_total":             1250,
		"sandboxstats_workload_io_read_operations_total":              0,
		"sandboxstats_workload_memory_limit_bytes":                    64 << 20,
		"sandboxstats_workload_pids":                                  3,
		"sandboxstats_workload_pressure_cpu_stalled_seconds_total":    -1, // absent: not offered
		"sandboxstats_workload_pressure_memory_waiting_seconds_total": -1,
		"sandboxstats_workload_pressure_io_stalled_seconds_total":     -1,
	}
	for name, w := range want {
		v, ok := got[name+lCgroup]
		switch {
		case w == -1 && ok:
			t.Errorf("%s = %v: the sample never offered it, so no series (absent, not 0)", name, v)
		case w != -1 && !ok:
			t.Errorf("no %s series", name)
		case w != -1 && v != w:
			t.Errorf("%s = %v, want %v", name, v, w)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(fams).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestLimitGaugeOnlyWhenAllLimited: a label set with a workload that is
// unlimited, or that offers no limit, has no limit series (unlimited is not
// a number, and a partial sum is not one either); pids likewise.
func TestLimitGaugeOnlyWhenAllLimited(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	limited := signalSample("w1", now.Add(-time.Minute), now, 1)
	unlimited := signalSample("w2", now.Add(-time.Minute), now, 1)
	unlimited.MemorySignals.LimitBytes = &sandboxstatsv1.Limit{Unlimited: true}
	other := signalSample("w3", now.Add(-time.Minute), now, 1)
	other.TemplateName = "other"
	noPids := signalSample("w4", now.Add(-time.Minute), now, 1)
	noPids.TemplateName, noPids.Pids = "other", nil
	m.Apply([]sweep.DaemonResult{okResult("1", limited), okResult("2", unlimited), okResult("3", other), okResult("4", noPids)}, now, 0)
	got := gather(t, reg)
	lOther := "{sandbox_class=gvisor,source=cgroup,template_name=other,template_namespace=templates}"
	if diff := cmp.Diff(map[string]float64{lOther: 128 << 20}, pick(got, metricMemoryLimit)); diff != "" {
		t.Errorf("limit (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{lCgroup: 6}, pick(got, metricPids)); diff != "" {
		t.Errorf("pids (-want +got):\n%s", diff)
	}
}

// TestLabelInterface: with LabelInterface the network counters are per
// interface (loopback never), with an interface label.
func TestLabelInterface(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: time.Minute, Started: t0, LabelInterface: true}, discard())
	if err != nil {
		t.Fatal(err)
	}
	epoch := t0.Add(10 * time.Second)
	m.Apply([]sweep.DaemonResult{okResult("1", signalSample("w1", epoch, t0.Add(20*time.Second), 4_000_000))}, t0.Add(20*time.Second), 0)
	got := pick(gather(t, reg), "sandboxstats_workload_network_transmit_bytes_total")
	want := map[string]float64{
		"{interface=eth0,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 6_000_000,
		"{interface=eth1,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 2_000_000,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("per interface (-want +got):\n%s", diff)
	}
}

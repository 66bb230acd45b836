package rate

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// watchSequence is one workload watched every 2 s through the cases a
// terminal user meets.
func watchSequence() []*sandboxstatsv1.WorkloadStatsSample {
	e2 := base.Add(30e9)
	return []*sandboxstatsv1.WorkloadStatsSample{
		smp(0, 10_000_000),                              // first sight: no rate
		smp(2, 11_000_000),                              // 1 s of CPU in 2 s: 0.500 cores
		smp(4, 13_000_000, mem(300<<20, 250<<20)),       // 1.000 cores; memory grew
		smp(6, 0, src(unspec)),                          // not measured: all absent
		smp(8, 14_000_000, mem(50<<20, 40<<20)),         // rated over 4 s: 0.250; memory dropped, shown as read
		smp(8, 14_500_000),                              // identical timestamp: no rate
		smp(10, 200_000),                                // counter decreased: reset
		smp(32, 300_000, epoch(e2), noPeak),             // restore: epoch reset, peak absent
		smp(34, 700_000, epoch(e2), noPeak),             // 0.200 cores
		smp(36, 700_000, epoch(e2), noPeak, src(guest)), // another layer: not comparable
	}
}

// TestWatcherRows: what each step of watchSequence yields. A rate exists
// only between comparable measured samples; memory is as read; a sample that
// was not measured shows nothing and keeps the baseline.
func TestWatcherRows(t *testing.T) {
	type view struct {
		Event            Event
		Interval, Cores  *float64
		CPU, Current, WS *uint64
		Peak             *uint64
		Source           string
	}
	f := func(v float64) *float64 { return &v }
	u := func(v uint64) *uint64 { return &v }
	m := func(n uint64) *uint64 { return u(n << 20) }
	want := []view{
		{EventFirst, nil, nil, u(10_000_000), m(100), m(80), m(120), "cgroup"},
		{EventNone, f(2), f(0.5), u(11_000_000), m(100), m(80), m(120), "cgroup"},
		{EventNone, f(2), f(1), u(13_000_000), m(300), m(250), m(120), "cgroup"},
		{EventNotMeasured, nil, nil, nil, nil, nil, nil, "unspecified"},
		{EventNone, f(4), f(0.25), u(14_000_000), m(50), m(40), m(120), "cgroup"}, // over the unmeasured sample
		{EventNoInterval, nil, nil, u(14_500_000), m(100), m(80), m(120), "cgroup"},
		{EventCounterReset, nil, nil, u(200_000), m(100), m(80), m(120), "cgroup"},
		{EventEpochReset, nil, nil, u(300_000), m(100), m(80), nil, "cgroup"},
		{EventNone, f(2), f(0.2), u(700_000), m(100), m(80), nil, "cgroup"},
		{EventSourceChanged, nil, nil, u(700_000), m(100), m(80), nil, "guest-agent"},
	}
	var w Watcher
	var got []view
	for i, s := range watchSequence() {
		r := w.Observe(s)
		if !r.ObservedAt.Equal(time.Unix(0, s.GetObservedAtUnixNano())) || r.ActorUID != "a1" || r.SandboxClass != "gvisor" || r.EpochUnixNano != s.GetEpochUnixNano() {
			t.Errorf("row %d: attribution %+v does not match its sample", i, r)
		}
		got = append(got, view{r.Event, r.IntervalSeconds, r.CPUCores, r.CPUUsageUsec, r.MemoryCurrentBytes, r.MemoryWorkingSetBytes, r.MemoryPeakBytes, r.Source})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestWatcherNeverNegative(t *testing.T) {
	var w Watcher
	for i, s := range watchSequence() {
		r := w.Observe(s)
		if r.CPUCores != nil && *r.CPUCores < 0 {
			t.Errorf("row %d: negative rate %v", i, *r.CPUCores)
		}
		if (r.CPUCores == nil) != (r.Event != EventNone) {
			t.Errorf("row %d: rate %v with event %q: a row has a rate exactly when it has no event", i, r.CPUCores, r.Event)
		}
	}
}

// TestWatcherSignalRates: per interval, the throttled fraction, pressure
// stall per second, network and IO rates, each only when its counter is in
// both samples and did not decrease; none on a row without a CPU rate.
func TestWatcherSignalRates(t *testing.T) {
	with := func(s *sandboxstatsv1.WorkloadStatsSample, v map[Counter]uint64) *sandboxstatsv1.WorkloadStatsSample {
		for c, x := range v {
			setters[c](s, x)
		}
		return s
	}
	var w Watcher
	first := w.Observe(with(smp(0, 0), map[Counter]uint64{CounterThrottledUsec: 100, CounterPressureCPUSome: 0,
		CounterNetRxBytes: 5 << 20, CounterNetTxBytes: 0, CounterIOWriteBytes: 0}))
	if first.ThrottledFraction != nil || first.Pressure != nil || first.Network != nil || first.BlockIO != nil {
		t.Errorf("first sight has rates: %+v", first)
	}
	r := w.Observe(with(smp(2, 1_000_000), map[Counter]uint64{CounterThrottledUsec: 1_600_100, CounterPressureCPUSome: 1_000_000,
		CounterNetRxBytes: 1 << 20, CounterNetTxBytes: 20 << 20, CounterIOWriteBytes: 64 << 20}))
	f := func(v float64) *float64 { return &v }
	want := Row{
		ThrottledFraction: f(0.8),
		Pressure:          &PressureRates{CPU: &StallRates{WaitingUsecPerSec: f(500_000)}},
		Network:           &NetworkRates{TxBytesPerSec: f(10 << 20), RxPacketsPerSec: f(0), TxPacketsPerSec: f(0)}, // rx decreased: no rate
		BlockIO:           &BlockIORates{ReadBytesPerSec: f(0), WriteBytesPerSec: f(32 << 20), ReadOpsPerSec: f(0), WriteOpsPerSec: f(0)},
	}
	got := Row{ThrottledFraction: r.ThrottledFraction, Pressure: r.Pressure, Network: r.Network, BlockIO: r.BlockIO}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rates (-want +got):\n%s", diff)
	}
}

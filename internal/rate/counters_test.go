package rate

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func throttlingOf(s *sandboxstatsv1.WorkloadStatsSample) *sandboxstatsv1.CpuThrottling {
	if s.CpuThrottling == nil {
		s.CpuThrottling = &sandboxstatsv1.CpuThrottling{}
	}
	return s.CpuThrottling
}

func stallOf(s *sandboxstatsv1.WorkloadStatsSample, res string) *sandboxstatsv1.PressureStall {
	if s.Pressure == nil {
		s.Pressure = &sandboxstatsv1.Pressure{}
	}
	p := map[string]**sandboxstatsv1.PressureStall{"cpu": &s.Pressure.Cpu, "memory": &s.Pressure.Memory, "io": &s.Pressure.Io}[res]
	if *p == nil {
		*p = &sandboxstatsv1.PressureStall{}
	}
	return *p
}

func totalOf(s *sandboxstatsv1.WorkloadStatsSample) *sandboxstatsv1.InterfaceCounters {
	if s.Network == nil {
		s.Network = &sandboxstatsv1.NetworkStats{}
	}
	if s.Network.Total == nil {
		s.Network.Total = &sandboxstatsv1.InterfaceCounters{Name: "total"}
	}
	return s.Network.Total
}

func blockIOOf(s *sandboxstatsv1.WorkloadStatsSample) *sandboxstatsv1.BlockIo {
	if s.BlockIo == nil {
		s.BlockIo = &sandboxstatsv1.BlockIo{}
	}
	return s.BlockIo
}

// setters put a value in each counter of a sample, as a source would.
var setters = map[Counter]func(*sandboxstatsv1.WorkloadStatsSample, uint64){
	CounterCPU:           func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { s.CpuUsageUsec = proto.Uint64(v) },
	CounterThrottledUsec: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { throttlingOf(s).ThrottledUsec = proto.Uint64(v) },
	CounterPeriods:       func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { throttlingOf(s).Periods = proto.Uint64(v) },
	CounterThrottledPeriods: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) {
		throttlingOf(s).ThrottledPeriods = proto.Uint64(v)
	},
	CounterPressureCPUSome: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "cpu").SomeUsec = proto.Uint64(v) },
	CounterPressureCPUFull: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "cpu").FullUsec = proto.Uint64(v) },
	CounterPressureMemSome: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "memory").SomeUsec = proto.Uint64(v) },
	CounterPressureMemFull: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "memory").FullUsec = proto.Uint64(v) },
	CounterPressureIOSome:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "io").SomeUsec = proto.Uint64(v) },
	CounterPressureIOFull:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { stallOf(s, "io").FullUsec = proto.Uint64(v) },
	CounterOOMKills: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) {
		s.MemorySignals = &sandboxstatsv1.MemorySignals{OomKills: proto.Uint64(v)}
	},
	CounterNetRxBytes:    func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).RxBytes = v },
	CounterNetRxPackets:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).RxPackets = v },
	CounterNetRxErrors:   func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).RxErrors = v },
	CounterNetRxDropped:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).RxDropped = v },
	CounterNetTxBytes:    func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).TxBytes = v },
	CounterNetTxPackets:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).TxPackets = v },
	CounterNetTxErrors:   func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).TxErrors = v },
	CounterNetTxDropped:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { totalOf(s).TxDropped = v },
	CounterIOReadBytes:   func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { blockIOOf(s).ReadBytes = v },
	CounterIOWriteBytes:  func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { blockIOOf(s).WriteBytes = v },
	CounterIOReadOps:     func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { blockIOOf(s).ReadIos = v },
	CounterIOWriteOps:    func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { blockIOOf(s).WriteIos = v },
	CounterSandboxOwnCPU: func(s *sandboxstatsv1.WorkloadStatsSample, v uint64) { s.SandboxOwnCpuUsec = proto.Uint64(v) },
}

// TestCounterFields: each counter reads the field it names, and nothing
// else, and an empty sample carries none.
func TestCounterFields(t *testing.T) {
	if got := readings(&sandboxstatsv1.WorkloadStatsSample{}, false); len(got) != 0 {
		t.Errorf("an empty sample carries %v", got)
	}
	for c := range NumCounters {
		set := setters[c]
		if set == nil {
			t.Fatalf("no setter for %v", c)
		}
		s := &sandboxstatsv1.WorkloadStatsSample{}
		set(s, 7)
		for _, r := range readings(s, false) {
			want := uint64(0)
			if r.id.Counter == c {
				want = 7
			}
			if r.v != want {
				t.Errorf("%v set: %v reads %d, want %d", c, r.id.Counter, r.v, want)
			}
		}
		if v, ok := valueOf(s, CounterID{Counter: c}); !ok || v != 7 {
			t.Errorf("valueOf(%v) = %d, %v", c, v, ok)
		}
	}
}

// withCounter returns a copy of s whose counter c (and its baseline's)
// holds what its CPU counter holds, absent where the CPU counter is.
func withCounter(s *sandboxstatsv1.WorkloadStatsSample, c Counter) *sandboxstatsv1.WorkloadStatsSample {
	s = proto.Clone(s).(*sandboxstatsv1.WorkloadStatsSample)
	if s.CpuUsageUsec != nil {
		setters[c](s, s.GetCpuUsageUsec())
	}
	if fr := s.GetEpochBaseline().GetFirstRead(); fr != nil && fr.CpuUsageUsec != nil {
		setters[c](fr, fr.GetCpuUsageUsec())
	}
	return s
}

// TestAccountantEveryCounter runs the CPU counter's cases on every other
// counter (each sample carrying the counter with the CPU counter's value,
// beside the CPU counter): the epoch rules are the same, so are the
// charges. Counters of periods skip the case at the edge of the CPU-time
// bound and run the others unbounded: the CPU's microseconds are far more
// periods than the time allows (TestAccountantBounds has their bounds).
func TestAccountantEveryCounter(t *testing.T) {
	for c := CounterCPU + 1; c < NumCounters; c++ {
		for _, tc := range accountantCases() {
			if tc.timeBound && counterSpecs[c].bound == boundPeriods {
				continue
			}
			t.Run(fmt.Sprintf("%v/%s", c, tc.name), func(t *testing.T) {
				cpus := 2
				if counterSpecs[c].bound == boundPeriods {
					cpus = 0
				}
				a := NewAccountant(AccountantConfig{Started: started, CPUs: cpus, Horizon: time.Hour})
				for i, st := range tc.steps {
					s := withCounter(st.s, c)
					charges, ev := a.Sample(s, base.Add(time.Duration(i)*time.Second))
					got, gotEv := uint64(0), ev
					if ev != EventNotMeasured && ev != EventEnded {
						ch, ok := charges.Of(CounterID{Counter: c})
						got, gotEv = ch.Value, ch.Event
						if !ok {
							gotEv = EventCPUAbsent
						}
					}
					if got != st.charge || gotEv != st.ev {
						t.Errorf("step %d: %v = %d charged (%q), want %d (%q)", i, c, got, gotEv, st.charge, st.ev)
					}
				}
			})
		}
	}
}

// counterSmp returns a cgroup sample of smp's activation, its epoch begun
// at e, carrying only the given counters.
func counterSmp(atSec float64, e time.Time, values map[Counter]uint64) *sandboxstatsv1.WorkloadStatsSample {
	s := smp(atSec, 0, epoch(e), baselineAt(e), noCPU)
	for c, v := range values {
		setters[c](s, v)
	}
	return s
}

// TestAccountantBounds: what a window allows each kind of counter at its
// head, and a reused source seen through its bounded counters.
func TestAccountantBounds(t *testing.T) {
	e := base.Add(time.Minute) // 10 s before the samples at 70 s
	for _, tc := range []struct {
		name   string
		values map[Counter]uint64
		want   map[Counter]uint64
	}{
		{"10 s allow 10,000 periods", map[Counter]uint64{CounterPeriods: 10_000, CounterThrottledPeriods: 9_000},
			map[Counter]uint64{CounterPeriods: 10_000, CounterThrottledPeriods: 9_000}},
		{"but not 10,001: a reused cgroup, so nothing of it from the epoch start",
			map[Counter]uint64{CounterPeriods: 10_001, CounterOOMKills: 3, CounterNetTxBytes: 1 << 30},
			map[Counter]uint64{CounterPeriods: 0, CounterOOMKills: 0, CounterNetTxBytes: 0}},
		{"stall time is bounded like CPU time (2 CPUs x 10 s)",
			map[Counter]uint64{CounterPressureIOSome: 20_000_000, CounterThrottledUsec: 20_000_002},
			map[Counter]uint64{CounterPressureIOSome: 20_000_000, CounterThrottledUsec: 0}},
		{"bytes, packets and kills: only a plausibility bound (2^40 B/s, 2^32/s), no history",
			map[Counter]uint64{CounterOOMKills: 3, CounterNetTxBytes: 1 << 40, CounterIOWriteOps: 1 << 30},
			map[Counter]uint64{CounterOOMKills: 3, CounterNetTxBytes: 1 << 40, CounterIOWriteOps: 1 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
			charges, _ := a.Sample(counterSmp(70, e, tc.values), base)
			got := map[Counter]uint64{}
			for _, ch := range charges {
				if _, ok := tc.want[ch.ID.Counter]; ok {
					got[ch.ID.Counter] = ch.Value
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("head charges (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAccountantAbsentIsNotZero: a counter missing from a sample (a
// network down to loopback only, block IO the kernel stopped counting) is
// not charged, and is not a reset: when it comes back, it continues.
func TestAccountantAbsentIsNotZero(t *testing.T) {
	e := base.Add(-time.Hour)
	a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
	steps := []struct {
		s    *sandboxstatsv1.WorkloadStatsSample
		want uint64
		ok   bool
	}{
		{counterSmp(0, e, map[Counter]uint64{CounterNetTxBytes: 1000, CounterOOMKills: 0}), 1000, true},
		{counterSmp(60, e, map[Counter]uint64{CounterOOMKills: 1}), 0, false},
		{counterSmp(120, e, map[Counter]uint64{CounterNetTxBytes: 1500, CounterOOMKills: 1}), 500, true},
	}
	for i, st := range steps {
		charges, _ := a.Sample(st.s, base)
		ch, ok := charges.Of(CounterID{Counter: CounterNetTxBytes})
		if ok != st.ok || ch.Value != st.want {
			t.Errorf("step %d: tx bytes charged %d (present %v), want %d (present %v)", i, ch.Value, ok, st.want, st.ok)
		}
	}
}

// ifaceSmp returns a sample with these interfaces' tx bytes (and a total).
func ifaceSmp(atSec float64, tx map[string]uint64) *sandboxstatsv1.WorkloadStatsSample {
	s := smp(atSec, 0, baselineAt(base.Add(-time.Hour)))
	s.Network = &sandboxstatsv1.NetworkStats{Total: &sandboxstatsv1.InterfaceCounters{Name: "total"}}
	for _, n := range []string{"eth0", "eth1", "lo"} {
		if v, ok := tx[n]; ok {
			s.Network.Interfaces = append(s.Network.Interfaces, &sandboxstatsv1.InterfaceCounters{Name: n, TxBytes: v})
			if n != "lo" {
				s.Network.Total.TxBytes += v
			}
		}
	}
	return s
}

// TestAccountantPerInterface: with PerInterface each interface is its own
// account (loopback never; a name a guest made too long, or interfaces past
// MaxInterfaces, not at all); without it, the total.
func TestAccountantPerInterface(t *testing.T) {
	per := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour, PerInterface: true})
	total := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
	txOf := func(cs Charges) map[string]uint64 {
		out := map[string]uint64{}
		for _, c := range cs {
			if c.ID.Counter == CounterNetTxBytes {
				out["if:"+c.ID.Interface] = c.Value
			}
		}
		return out
	}
	for i, st := range []struct {
		tx              map[string]uint64
		wantPer, wantTo map[string]uint64
	}{
		{map[string]uint64{"eth0": 100, "eth1": 10, "lo": 5}, map[string]uint64{"if:eth0": 100, "if:eth1": 10}, map[string]uint64{"if:": 110}},
		{map[string]uint64{"eth0": 150, "lo": 9}, map[string]uint64{"if:eth0": 50}, map[string]uint64{"if:": 40}}, // eth1 gone: the total fell, a reset
		{map[string]uint64{"eth0": 160, "eth1": 30}, map[string]uint64{"if:eth0": 10, "if:eth1": 20}, map[string]uint64{"if:": 40}},
	} {
		cp, _ := per.Sample(ifaceSmp(float64(60*i), st.tx), base)
		ct, _ := total.Sample(ifaceSmp(float64(60*i), st.tx), base)
		if diff := cmp.Diff(st.wantPer, txOf(cp)); diff != "" {
			t.Errorf("step %d per interface (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(st.wantTo, txOf(ct)); diff != "" {
			t.Errorf("step %d total (-want +got):\n%s", i, diff)
		}
	}
	s := smp(0, 0, baselineAt(base.Add(-time.Hour)), actor("many"))
	s.Network = &sandboxstatsv1.NetworkStats{}
	for i := range MaxInterfaces + 4 {
		s.Network.Interfaces = append(s.Network.Interfaces, &sandboxstatsv1.InterfaceCounters{Name: fmt.Sprintf("veth%d", i), TxBytes: 1})
	}
	s.Network.Interfaces = append([]*sandboxstatsv1.InterfaceCounters{{Name: "", TxBytes: 1}}, s.Network.Interfaces...)
	s.Network.Interfaces = append(s.Network.Interfaces, &sandboxstatsv1.InterfaceCounters{Name: string(make([]byte, MaxInterfaceName+1)), TxBytes: 1})
	cs, _ := per.Sample(s, base)
	if got := txOf(cs); len(got) != MaxInterfaces || got["if:"] != 0 {
		t.Errorf("%d interfaces accounted (%v), want at most %d, none without a name", len(got), got, MaxInterfaces)
	}
}

// TestAccountantEndsEveryCounter: an ended record charges each counter of
// its final sample by the epoch rules: the tail after the last sample, the
// whole own usage (final minus the baseline's value) of an activation never
// sampled, nothing of a reused source's.
func TestAccountantEndsEveryCounter(t *testing.T) {
	now := base.Add(time.Hour)
	final := func(e *sandboxstatsv1.EndedActivation, values map[Counter]uint64) {
		for c, v := range values {
			setters[c](e.Final, v)
		}
	}
	t.Run("tail", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		s := smp(0, 1_000, baselineAt(base.Add(-time.Hour)))
		setters[CounterOOMKills](s, 0)
		setters[CounterIOWriteBytes](s, 1<<20)
		a.Sample(s, now)
		e := ended(30, 2_000)
		final(e, map[Counter]uint64{CounterOOMKills: 1, CounterIOWriteBytes: 65 << 20})
		cs, how, _ := a.End(e, now)
		want := Charges{{ID: CounterID{Counter: CounterCPU}, Value: 1_000}, {ID: CounterID{Counter: CounterOOMKills}, Value: 1},
			{ID: CounterID{Counter: CounterIOWriteBytes}, Value: 64 << 20}, {ID: CounterID{Counter: CounterIOReadBytes}},
			{ID: CounterID{Counter: CounterIOReadOps}}, {ID: CounterID{Counter: CounterIOWriteOps}}}
		if diff := cmp.Diff(want, cs, sortCharges()); diff != "" || how != EndTail {
			t.Errorf("End %q (-want +got):\n%s", how, diff)
		}
	})
	t.Run("never sampled, guest agent: final minus the baseline's value", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		e := ended(30, 500)
		e.Source = guest
		e.Final.Source = guest
		e.Final.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ,
			ObservedAtUnixNano: base.Add(-time.Hour).UnixNano(), FirstRead: &sandboxstatsv1.WorkloadStatsSample{}}
		setters[CounterNetTxBytes](e.Final.EpochBaseline.FirstRead, 10<<20)
		final(e, map[Counter]uint64{CounterNetTxBytes: 15 << 20})
		cs, how, _ := a.End(e, now)
		if ch, _ := cs.Of(CounterID{Counter: CounterNetTxBytes}); ch.Value != 5<<20 || how != EndWhole {
			t.Errorf("tx charged %d (%q), want 5 MiB, the whole activation's own", ch.Value, how)
		}
	})
	t.Run("never sampled, more CPU than its time allows: a reused source, nothing of it", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 1, Horizon: 2 * time.Hour})
		e := ended(30, 1e12)
		final(e, map[Counter]uint64{CounterNetTxBytes: 1 << 40})
		cs, how, _ := a.End(e, now)
		if ch, _ := cs.Of(CounterID{Counter: CounterNetTxBytes}); ch.Value != 0 || how != EndImplausible {
			t.Errorf("tx charged %d (%q), want nothing", ch.Value, how)
		}
	})
	t.Run("no final: only the record's CPU; a delta-mode account does not crash", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		a.Sample(smp(0, 5_000, src(guest)), now) // no baseline: delta mode
		e := ended(30, 0, func(e *sandboxstatsv1.EndedActivation) {
			e.Source, e.Final, e.CpuUsec = guest, nil, nil
			e.FinalProvenance = sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_NONE
		})
		cs, how, first := a.End(e, now)
		if len(cs) != 0 || how != EndNoCPU || !first {
			t.Errorf("End = %v %q %v", cs, how, first)
		}
	})
}

// TestAccountantHostileBaseline: a FIRST_READ baseline without its read (a
// daemon that is not statsd) is no baseline; it does not crash the agent.
func TestAccountantHostileBaseline(t *testing.T) {
	a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
	s := smp(0, 5_000, src(guest))
	s.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ}
	if c, ev := cpuSample(a.Sample(s, base)); c != 0 || ev != EventFirst {
		t.Errorf("Sample = %d %q, want nothing at first sight", c, ev)
	}
}

func sortCharges() cmp.Option {
	return cmp.Transformer("byCounter", func(cs Charges) map[CounterID]Charge {
		out := map[CounterID]Charge{}
		for _, c := range cs {
			out[c.ID] = c
		}
		return out
	})
}

// TestAccountantHeadSlack: a sandbox that booted before its Run (runsc made
// its cgroup first) has CPU from before the epoch: within the slack the
// head is charged, a longer history (a reused cgroup) is not.
func TestAccountantHeadSlack(t *testing.T) {
	e := base.Add(time.Minute) // the samples at 70 s are 10 s into the epoch
	for _, tc := range []struct {
		name  string
		cpu   uint64
		slack time.Duration
		want  uint64
	}{
		{"without slack, 2 CPUs x 10 s at most", 20_000_002, 0, 0},
		{"10 s of slack: 2 CPUs x 20 s", 40_000_000, 10 * time.Second, 40_000_000},
		{"a history beyond the slack is still refused", 40_000_002, 10 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour, HeadSlack: tc.slack})
			s := smp(70, tc.cpu, epoch(e), baselineAt(e))
			charges, _ := a.Sample(s, base)
			if c, _ := charges.Of(CounterID{Counter: CounterCPU}); c.Value != tc.want {
				t.Errorf("head = %d, want %d", c.Value, tc.want)
			}
		})
	}
}

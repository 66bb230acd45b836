package rate

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

const (
	cgroup = sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP
	guest  = sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
	unspec = sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED
)

// base is 2026-11-29T17:00:00Z.
var base = time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)

// smp returns a cgroup sample of actor "a1" in epoch 1, observed at base +
// atSec seconds with the given CPU counter; opts adjust it.
func smp(atSec float64, cpuUsec uint64, opts ...func(*sandboxstatsv1.WorkloadStatsSample)) *sandboxstatsv1.WorkloadStatsSample {
	s := &sandboxstatsv1.WorkloadStatsSample{
		ActorUid:              "a1",
		SandboxClass:          sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source:                cgroup,
		MemoryCurrentBytes:    100 << 20,
		MemoryWorkingSetBytes: 80 << 20,
		MemoryPeakBytes:       proto.Uint64(120 << 20),
		CpuUsageUsec:          proto.Uint64(cpuUsec),
		ObservedAtUnixNano:    base.Add(time.Duration(atSec * float64(time.Second))).UnixNano(),
		EpochUnixNano:         base.Add(-time.Hour).UnixNano(),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// noCPU drops the CPU counter (a partial guest sample).
func noCPU(s *sandboxstatsv1.WorkloadStatsSample) { s.CpuUsageUsec = nil }

func epoch(e time.Time) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) { s.EpochUnixNano = e.UnixNano() }
}

func src(v sandboxstatsv1.StatsSource) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) { s.Source = v }
}

func actor(uid string) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) { s.ActorUid = uid }
}

func mem(cur, ws uint64) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) {
		s.MemoryCurrentBytes, s.MemoryWorkingSetBytes = cur, ws
	}
}

func noPeak(s *sandboxstatsv1.WorkloadStatsSample) { s.MemoryPeakBytes = nil }

func TestCPUCores(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur *sandboxstatsv1.WorkloadStatsSample
		wantCores float64
		wantEvent Event
		wantOK    bool
	}{
		{"normal: 1.5 s of CPU in 10 s is 0.15 cores", smp(0, 1_000_000), smp(10, 2_500_000), 0.15, EventNone, true},
		{"two busy cores", smp(0, 0), smp(0.5, 1_000_000), 2, EventNone, true},
		{"idle: counter unchanged is 0 cores", smp(0, 7), smp(60, 7), 0, EventNone, true},
		{"first sight", nil, smp(0, 5), 0, EventFirst, false},
		{"counter reset within the epoch", smp(0, 9_000_000), smp(10, 1_000), 0, EventCounterReset, false},
		{"epoch change with a lower counter", smp(0, 9_000_000), smp(10, 1_000, epoch(base)), 0, EventEpochReset, false},
		{"epoch change with a higher counter (carried guest counter)",
			smp(0, 1_000, src(guest)), smp(10, 9_000_000, src(guest), epoch(base)), 0, EventEpochReset, false},
		{"identical timestamps", smp(10, 1_000), smp(10, 2_000), 0, EventNoInterval, false},
		{"timestamp went backwards", smp(10, 1_000), smp(9, 2_000), 0, EventNoInterval, false},
		{"not measured", smp(0, 1_000), smp(10, 0, src(unspec)), 0, EventNotMeasured, false},
		{"source changed", smp(0, 1_000), smp(10, 2_000, src(guest)), 0, EventSourceChanged, false},
		{"actor changed", smp(0, 1_000), smp(10, 2_000, actor("a2")), 0, EventActorChanged, false},
		{"epoch zero on both sides still rates", smp(0, 0, epoch(time.Unix(0, 0))), smp(1, 250_000, epoch(time.Unix(0, 0))), 0.25, EventNone, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cores, ev, ok := cpuCores(tc.prev, tc.cur)
			if diff := cmp.Diff(
				struct {
					Cores float64
					Event Event
					OK    bool
				}{tc.wantCores, tc.wantEvent, tc.wantOK},
				struct {
					Cores float64
					Event Event
					OK    bool
				}{cores, ev, ok}); diff != "" {
				t.Errorf("cpuCores (-want +got):\n%s", diff)
			}
			if cores < 0 {
				t.Errorf("negative rate %v", cores)
			}
		})
	}
}

// started is when the accountant under test started: base minus 2 hours,
// so that the default epoch of smp (base - 1 h) began after it.
var started = base.Add(-2 * time.Hour)

func baselineAt(e time.Time) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) {
		s.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START, ObservedAtUnixNano: e.UnixNano()}
	}
}

func firstRead(at time.Time, cpu uint64) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) {
		s.EpochBaseline = &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ, ObservedAtUnixNano: at.UnixNano(),
			FirstRead: &sandboxstatsv1.WorkloadStatsSample{CpuUsageUsec: proto.Uint64(cpu)}}
	}
}

// step is one sample of an accountant case and what it must charge to the
// CPU counter (EventCPUAbsent: nothing, the counter is absent).
type step struct {
	s      *sandboxstatsv1.WorkloadStatsSample
	charge uint64
	ev     Event
}

type accountantCase struct {
	name  string
	steps []step
	// timeBound: the case's values, microseconds of CPU, are more periods
	// than its time allows (TestAccountantBounds has the periods' own).
	timeBound bool
}

// accountantCases are the CPU counter's cases; every other counter follows
// the same rules (TestAccountantEveryCounter).
func accountantCases() []accountantCase {
	e1 := base.Add(-time.Hour)
	e2 := base.Add(time.Minute)
	old := started.Add(-time.Hour) // an epoch begun before the accountant
	return []accountantCase{
		{"head: first sight of an epoch begun after the start charges it in full, then deltas", []step{
			{smp(0, 1_000_000, baselineAt(e1)), 1_000_000, EventFirst},
			{smp(60, 1_600_000, baselineAt(e1)), 600_000, EventNone},
			{smp(120, 1_600_000, baselineAt(e1)), 0, EventNone},
		}, false},
		{"a cgroup sample without a baseline (an old statsd) counts from the epoch start", []step{
			{smp(0, 1_000_000), 1_000_000, EventFirst},
		}, false},
		{"an epoch begun before the start charges nothing at first sight", []step{
			{smp(0, 1_000_000_000, epoch(old), baselineAt(old)), 0, EventFirst},
			{smp(60, 1_000_600_000, epoch(old), baselineAt(old)), 600_000, EventNone},
		}, false},
		{"a sample without a CPU counter charges nothing and keeps the last value", []step{
			{smp(0, 1_000_000, baselineAt(e1)), 1_000_000, EventFirst},
			{smp(60, 0, noCPU, baselineAt(e1)), 0, EventCPUAbsent},
			{smp(120, 1_500_000, baselineAt(e1)), 500_000, EventNone},
		}, false},
		{"upstream TestStatsPollerCPUDeltas: 1000 -> 0 -> 600 -> 250", []step{
			{smp(0, 1000, epoch(old)), 0, EventFirst},
			{smp(60, 0, epoch(old)), 0, EventCounterReset},
			{smp(120, 600, epoch(old)), 600, EventNone},
			{smp(180, 250, epoch(old)), 250, EventCounterReset},
		}, false},
		{"a new cgroup epoch is a new activation, charged from its start", []step{
			{smp(0, 5_000_000, baselineAt(e1)), 5_000_000, EventFirst},
			{smp(120, 7_000_000, epoch(e2), baselineAt(e2)), 7_000_000, EventFirst},
			{smp(180, 7_500_000, epoch(e2), baselineAt(e2)), 500_000, EventNone},
		}, true},
		{"a counter too large for the time since the epoch began is a reused cgroup: a baseline", []step{
			// 10 s into the epoch, 2 CPUs: at most 20 s could be its own.
			{smp(70, 500_000_000, epoch(e2), baselineAt(e2)), 0, EventFirst},
			{smp(80, 501_000_000, epoch(e2), baselineAt(e2)), 1_000_000, EventNone},
		}, true},
		{"at the plausibility limit it is charged", []step{
			{smp(70, 20_000_000, epoch(e2), baselineAt(e2)), 20_000_000, EventFirst},
		}, true},
		{"decrease to a value too large for the time since the last sample", []step{
			{smp(0, 900_000_000, epoch(old)), 0, EventFirst},
			{smp(60, 800_000_000, epoch(old)), 0, EventCounterReset},
			{smp(120, 800_500_000, epoch(old)), 500_000, EventNone},
		}, true},
		{"guest agent: the carried counter minus the first read is the activation's own", []step{
			{smp(120, 6_100_000, src(guest), epoch(e2), firstRead(e2.Add(time.Second), 6_000_000)), 100_000, EventFirst},
			{smp(180, 6_400_000, src(guest), epoch(e2), firstRead(e2.Add(time.Second), 6_000_000)), 300_000, EventNone},
		}, true},
		{"guest agent without a baseline: first sight charges nothing, then deltas", []step{
			{smp(0, 5_000_000, src(guest)), 0, EventFirst},
			{smp(60, 6_000_000, src(guest)), 1_000_000, EventNone},
		}, false},
		{"guest agent decrease below the baseline charges the new value in full", []step{
			{smp(0, 5_100_000, src(guest), firstRead(base.Add(-time.Minute), 5_000_000)), 100_000, EventFirst},
			{smp(60, 2_000, src(guest), firstRead(base.Add(-time.Minute), 5_000_000)), 0, EventCounterReset},
		}, true},
		{"not measured keeps the last value", []step{
			{smp(0, 1_000, baselineAt(e1)), 1_000, EventFirst},
			{smp(60, 0, src(unspec)), 0, EventNotMeasured},
			{smp(120, 4_000, baselineAt(e1)), 3_000, EventNone},
		}, false},
		{"sources are separate counters", []step{
			{smp(0, 1_000, epoch(old)), 0, EventFirst},
			{smp(0, 50_000, src(guest), epoch(old)), 0, EventFirst},
			{smp(60, 2_000, epoch(old)), 1_000, EventNone},
			{smp(60, 51_000, src(guest), epoch(old)), 1_000, EventNone},
		}, false},
	}
}

func TestAccountantSamples(t *testing.T) {
	for _, tc := range accountantCases() {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
			for i, st := range tc.steps {
				charges, ev := a.Sample(st.s, base.Add(time.Duration(i)*time.Second))
				if charge := charges.CPU(); charge != st.charge || ev != st.ev {
					t.Errorf("step %d: Sample(cpu=%d) = (%d, %q), want (%d, %q)",
						i, st.s.GetCpuUsageUsec(), charges.CPU(), ev, st.charge, st.ev)
				}
			}
		})
	}
}

// cpuSample and cpuEnd return the CPU counter's charge of a Sample and an
// End.
func cpuSample(cs Charges, ev Event) (uint64, Event) { return cs.CPU(), ev }

func cpuEnd(cs Charges, how EndEvent, first bool) (uint64, EndEvent, bool) {
	return cs.CPU(), how, first
}

// ended returns the record of smp's activation (actor a1, cgroup, epoch
// base - 1 h) ending at base + endSec with own CPU cpu.
func ended(endSec float64, cpu uint64, opts ...func(*sandboxstatsv1.EndedActivation)) *sandboxstatsv1.EndedActivation {
	e := &sandboxstatsv1.EndedActivation{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "a1"}, Source: cgroup,
		EpochUnixNano: base.Add(-time.Hour).UnixNano(), EndUnixNano: base.Add(time.Duration(endSec * float64(time.Second))).UnixNano(),
		FinalProvenance: sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END,
		Final:           smp(endSec, cpu), CpuUsec: proto.Uint64(cpu),
	}
	for _, o := range opts {
		o(e)
	}
	return e
}

func TestAccountantEnds(t *testing.T) {
	now := base.Add(time.Hour)
	t.Run("the tail from the last sample to the final, once", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		a.Sample(smp(0, 1_000_000, baselineAt(base.Add(-time.Hour))), now)
		if c, ev, first := cpuEnd(a.End(ended(30, 1_400_000), now)); c != 400_000 || ev != EndTail || !first {
			t.Fatalf("End = %d %q %v, want the 400000 tail", c, ev, first)
		}
		if c, _, first := cpuEnd(a.End(ended(30, 1_400_000), now)); c != 0 || first {
			t.Fatalf("repeated record charged %d (first %v)", c, first)
		}
		if c, ev := cpuSample(a.Sample(smp(0, 1_000_000, baselineAt(base.Add(-time.Hour))), now)); c != 0 || ev != EventEnded {
			t.Fatalf("a late sample of the ended activation charged %d (%q)", c, ev)
		}
	})
	t.Run("never sampled: the whole activation", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		if c, ev, _ := cpuEnd(a.End(ended(30, 2_500_000), now)); c != 2_500_000 || ev != EndWhole {
			t.Fatalf("End = %d %q, want the whole 2500000", c, ev)
		}
	})
	t.Run("never sampled, begun before the start: nothing", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: base.Add(-30 * time.Minute), CPUs: 2, Horizon: 2 * time.Hour})
		if c, ev, first := cpuEnd(a.End(ended(30, 2_500_000), now)); c != 0 || ev != EndUnseenOld || !first {
			t.Fatalf("End = %d %q %v", c, ev, first)
		}
	})
	t.Run("ended before the start or past the horizon: ignored", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: base.Add(time.Minute), CPUs: 2, Horizon: 2 * time.Hour})
		if _, _, first := cpuEnd(a.End(ended(30, 1), now)); first {
			t.Fatal("a record that ended before this poller started was charged")
		}
		b := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Minute})
		if _, _, first := cpuEnd(b.End(ended(30, 1), now)); first {
			t.Fatal("a record past the horizon was charged")
		}
	})
	t.Run("no CPU in the record", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		e := ended(30, 0, func(e *sandboxstatsv1.EndedActivation) { e.CpuUsec, e.Final = nil, nil })
		if c, ev, first := cpuEnd(a.End(e, now)); c != 0 || ev != EndNoCPU || !first {
			t.Fatalf("End = %d %q %v", c, ev, first)
		}
	})
	t.Run("implausible whole", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 1, Horizon: 2 * time.Hour})
		e := ended(30, 1e12)
		if c, ev, _ := cpuEnd(a.End(e, now)); c != 0 || ev != EndImplausible {
			t.Fatalf("End = %d %q", c, ev)
		}
	})
	t.Run("prune forgets past the horizon, not before", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 10 * time.Minute})
		a.Sample(smp(0, 1_000, baselineAt(base.Add(-time.Hour))), base)
		a.End(ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.Identity.ActorUid = "a2" }), base)
		if got := a.Prune(base.Add(9 * time.Minute)); len(got) != 0 {
			t.Fatalf("pruned %v within the horizon", got)
		}
		// Seen again within the horizon: it continues, nothing twice.
		if c, ev := cpuSample(a.Sample(smp(540, 1_500, baselineAt(base.Add(-time.Hour))), base.Add(9*time.Minute))); c != 500 || ev != EventNone {
			t.Fatalf("continued sample = %d %q, want 500", c, ev)
		}
		if got := a.Prune(base.Add(20 * time.Minute)); len(got) != 1 {
			t.Fatalf("pruned %v past the horizon", got)
		}
		if live, done := a.Len(); live != 0 || done != 0 {
			t.Fatalf("Len = %d live, %d ended past the horizon", live, done)
		}
	})
}

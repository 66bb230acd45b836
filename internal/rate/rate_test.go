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
			cores, ev, ok := CPUCores(tc.prev, tc.cur)
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
				t.Errorf("CPUCores (-want +got):\n%s", diff)
			}
			if cores < 0 {
				t.Errorf("negative rate %v", cores)
			}
		})
	}
}

func TestCPUCounter(t *testing.T) {
	e2 := base.Add(time.Minute)
	type step struct {
		s      *sandboxstatsv1.WorkloadStatsSample
		charge uint64
		ev     Event
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first sight charges nothing, then deltas", []step{
			{smp(0, 1_000_000_000), 0, EventFirst},
			{smp(60, 1_000_600_000), 600_000, EventNone},
			{smp(120, 1_000_600_000), 0, EventNone},
		}},
		{"a sample without a CPU counter charges nothing and keeps the baseline", []step{
			{smp(0, 1_000_000), 0, EventFirst},
			{smp(60, 0, noCPU), 0, EventCPUAbsent},
			{smp(120, 1_500_000), 500_000, EventNone},
		}},
		{"upstream TestStatsPollerCPUDeltas: 1000 -> 0 -> 600 -> 250", []step{
			{smp(0, 1000), 0, EventFirst},
			{smp(60, 0), 0, EventCounterReset},
			{smp(120, 600), 600, EventNone},
			{smp(180, 250), 250, EventCounterReset},
		}},
		{"cgroup epoch change charges the new epoch's value in full", []step{
			{smp(0, 5_000_000), 0, EventFirst},
			{smp(60, 6_000_000), 1_000_000, EventNone},
			{smp(120, 7_000_000, epoch(e2)), 7_000_000, EventEpochReset},
			{smp(180, 7_500_000, epoch(e2)), 500_000, EventNone},
		}},
		{"cgroup epoch change detected even when the counter is lower", []step{
			{smp(0, 5_000_000), 0, EventFirst},
			{smp(70, 300, epoch(e2)), 300, EventEpochReset},
		}},
		{"cgroup epoch change with a counter that cannot be the new epoch's (reused cgroup)", []step{
			{smp(0, 5_000_000), 0, EventFirst},
			// 10 s into the new epoch, 2 CPUs: at most 20 s could be new.
			{smp(70, 500_000_000, epoch(e2)), 0, EventEpochReset},
			{smp(80, 501_000_000, epoch(e2)), 1_000_000, EventNone},
		}},
		{"cgroup epoch change at the plausibility limit is charged", []step{
			{smp(0, 5_000_000), 0, EventFirst},
			{smp(70, 20_000_000, epoch(e2)), 20_000_000, EventEpochReset},
		}},
		{"decrease to a value too large for the time since the last sample", []step{
			{smp(0, 900_000_000), 0, EventFirst},
			{smp(60, 800_000_000), 0, EventCounterReset},
			{smp(120, 800_500_000), 500_000, EventNone},
		}},
		{"guest agent epoch change: carried counter is a new baseline", []step{
			{smp(0, 5_000_000, src(guest)), 0, EventFirst},
			{smp(60, 6_000_000, src(guest)), 1_000_000, EventNone},
			{smp(120, 6_100_000, src(guest), epoch(e2)), 0, EventEpochReset},
			{smp(180, 6_400_000, src(guest), epoch(e2)), 300_000, EventNone},
		}},
		{"guest agent decrease within the epoch charges in full", []step{
			{smp(0, 5_000_000, src(guest)), 0, EventFirst},
			{smp(60, 2_000, src(guest)), 2_000, EventCounterReset},
		}},
		{"not measured keeps the baseline", []step{
			{smp(0, 1_000), 0, EventFirst},
			{smp(60, 0, src(unspec)), 0, EventNotMeasured},
			{smp(120, 4_000), 3_000, EventNone},
		}},
		{"sources are separate counters", []step{
			{smp(0, 1_000), 0, EventFirst},
			{smp(0, 50_000, src(guest)), 0, EventFirst},
			{smp(60, 2_000), 1_000, EventNone},
			{smp(60, 51_000, src(guest)), 1_000, EventNone},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCPUCounter(time.Minute, 2)
			for i, st := range tc.steps {
				charge, ev := c.Observe(st.s, base.Add(time.Duration(i)*time.Second))
				if charge != st.charge || ev != st.ev {
					t.Errorf("step %d: Observe(cpu=%d) = (%d, %q), want (%d, %q)",
						i, st.s.GetCpuUsageUsec(), charge, ev, st.charge, st.ev)
				}
			}
		})
	}
}

func TestCPUCounterGrace(t *testing.T) {
	c := NewCPUCounter(5*time.Minute, 2)
	c.Observe(smp(0, 1_000), base)
	c.Observe(smp(0, 1_000, actor("a2")), base)
	c.Observe(smp(240, 2_000, actor("a2")), base.Add(4*time.Minute))
	if got := c.Prune(base.Add(5 * time.Minute)); len(got) != 0 {
		t.Fatalf("Prune at the grace boundary forgot %v", got)
	}
	got := c.Prune(base.Add(6 * time.Minute))
	if diff := cmp.Diff([]WorkloadKey{{ActorUID: "a1", Source: cgroup}}, got); diff != "" {
		t.Errorf("Prune (-want +got):\n%s", diff)
	}
	// a1 comes back: first sight again, nothing charged.
	if charge, ev := c.Observe(smp(400, 90_000), base.Add(7*time.Minute)); charge != 0 || ev != EventFirst {
		t.Errorf("returning workload: (%d, %q), want (0, first-sight)", charge, ev)
	}
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
}

package rate

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// FuzzRates checks the invariants of cpuCores and the Accountant over arbitrary
// pairs of samples: a rate is never negative and exists exactly when the
// step continues the series; one step never charges more than the new
// counter value.
func FuzzRates(f *testing.F) {
	f.Add(int64(0), int64(10e9), uint64(1_000_000), uint64(2_500_000), int64(1), int64(1), uint8(1), uint8(1))
	f.Add(int64(10e9), int64(10e9), uint64(1), uint64(2), int64(1), int64(1), uint8(1), uint8(1))
	f.Add(int64(0), int64(60e9), uint64(9_000_000), uint64(300), int64(1), int64(30e9), uint8(1), uint8(1))
	f.Add(int64(0), int64(60e9), uint64(1000), uint64(0), int64(5), int64(5), uint8(2), uint8(2))
	f.Add(int64(0), int64(1), uint64(0), uint64(1<<63), int64(0), int64(0), uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, at1, at2 int64, cpu1, cpu2 uint64, ep1, ep2 int64, src1, src2 uint8) {
		mk := func(at int64, cpu uint64, ep int64, src uint8) *sandboxstatsv1.WorkloadStatsSample {
			return &sandboxstatsv1.WorkloadStatsSample{
				ActorUid: "a", Source: sandboxstatsv1.StatsSource(src % 3),
				CpuUsageUsec: proto.Uint64(cpu), ObservedAtUnixNano: at, EpochUnixNano: ep,
			}
		}
		prev, cur := mk(at1, cpu1, ep1, src1), mk(at2, cpu2, ep2, src2)
		cores, ev, ok := cpuCores(prev, cur)
		if cores < 0 {
			t.Fatalf("negative rate %v", cores)
		}
		if ok != (ev == EventNone) {
			t.Fatalf("ok=%v with event %q", ok, ev)
		}
		a := NewAccountant(AccountantConfig{CPUs: 2, Horizon: time.Hour})
		now := time.Unix(0, 0)
		c1, _ := cpuSample(a.Sample(prev, now))
		c2, _ := cpuSample(a.Sample(cur, now))
		if c1 > prev.GetCpuUsageUsec() || c2 > cur.GetCpuUsageUsec() {
			t.Fatalf("charged %d and %d, more than the counters %d and %d", c1, c2, prev.GetCpuUsageUsec(), cur.GetCpuUsageUsec())
		}
	})
}

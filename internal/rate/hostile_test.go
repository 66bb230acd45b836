package rate

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestEndedForgottenByAgentClock: an ended record is remembered for the
// horizon from when this agent first saw it, whatever end time its daemon
// wrote: one ending a year in the future is forgotten like any other.
func TestEndedForgottenByAgentClock(t *testing.T) {
	now := base.Add(time.Hour)
	for _, tc := range []struct {
		name string
		end  time.Time
	}{
		{"ended a minute ago", now.Add(-time.Minute)},
		{"ending in a year", now.Add(365 * 24 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 10 * time.Minute})
			e := ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.EndUnixNano = tc.end.UnixNano() })
			if _, _, first := a.End(e, now); !first {
				t.Fatal("the record was not charged")
			}
			a.Prune(now.Add(9 * time.Minute))
			if _, done := a.Len(); done != 1 {
				t.Fatalf("Len ended = %d within the horizon, want 1", done)
			}
			a.Prune(now.Add(11 * time.Minute))
			if _, done := a.Len(); done != 0 {
				t.Errorf("Len ended = %d past the horizon by the agent's clock, want 0", done)
			}
		})
	}
}

// TestEndedKeyCut: the key of an activation keeps at most the label cut of
// its actor uid, so a daemon's long uids cost no more than a label each;
// a uid within the cut is kept whole.
func TestEndedKeyCut(t *testing.T) {
	long := strings.Repeat("u", 10_000)
	e := ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.Identity.ActorUid = long })
	if got := len(EndedKeyOf(e).ActorUID); got > maxKeyUIDBytes+24 {
		t.Errorf("EndedKeyOf keeps %d bytes of a %d-byte uid, want at most %d", got, len(long), maxKeyUIDBytes+24)
	}
	if got := len(KeyOf(smp(0, 1, actor(long))).ActorUID); got > maxKeyUIDBytes+24 {
		t.Errorf("KeyOf keeps %d bytes of a %d-byte uid", got, len(long))
	}
	if EndedKeyOf(e) != KeyOf(smp(0, 1, actor(long))) {
		t.Error("a sample and the record of one activation have different keys")
	}
	// Two uids of one length sharing their first 9,999 bytes: a cut
	// alone ("...(+N bytes)") would be one key.
	other := long[:len(long)-1] + "v"
	if KeyOf(smp(0, 1, actor(long))) == KeyOf(smp(0, 1, actor(other))) {
		t.Errorf("two distinct %d-byte uids share a key: %q", len(long), KeyOf(smp(0, 1, actor(long))).ActorUID)
	}
	short := strings.Repeat("u", maxKeyUIDBytes)
	if got := KeyOf(smp(0, 1, actor(short))).ActorUID; got != short {
		t.Errorf("a %d-byte uid was cut to %q", len(short), got)
	}
}

// TestEndedCapped: at most MaxEnded ended records are remembered; beyond
// it the oldest is forgotten first, and counted.
func TestEndedCapped(t *testing.T) {
	now := base.Add(time.Hour)
	a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour, MaxEnded: 3})
	for i := range 5 {
		e := ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.Identity.ActorUid = string(rune('a' + i)) })
		a.End(e, now.Add(time.Duration(i)*time.Second))
	}
	if _, done := a.Len(); done != 3 {
		t.Errorf("Len ended = %d, want the cap 3", done)
	}
	if got := a.Refused()[RefusedEndedEvicted]; got != 2 {
		t.Errorf("evicted = %d, want 2", got)
	}
	// The newest are remembered: charged nothing again; the oldest is
	// charged again (its eviction was counted).
	newest := ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.Identity.ActorUid = "e" })
	if _, _, first := a.End(newest, now.Add(time.Minute)); first {
		t.Error("the newest record was forgotten")
	}
	oldest := ended(0, 5, func(e *sandboxstatsv1.EndedActivation) { e.Identity.ActorUid = "a" })
	if _, _, first := a.End(oldest, now.Add(time.Minute)); !first {
		t.Error("the oldest record was kept past the cap")
	}
}

// TestImplausibleGrowth: a body or a tail growing more than CPUs x the
// time since the last sample, or a counter at an absurd value, charges
// nothing and is counted; the activation's later plausible growth is
// charged from there.
func TestImplausibleGrowth(t *testing.T) {
	e1 := base.Add(-time.Hour)
	t.Run("body growth past the bound", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		a.Sample(smp(0, 1_000, baselineAt(e1)), base)
		if c, ev := cpuSample(a.Sample(smp(60, 1_000+121_000_000+2_000_000, baselineAt(e1)), base)); c != 0 || ev != EventImplausible {
			t.Errorf("growth of 123 s in 60 s on 2 CPUs charged %d (%q), want 0 (%q)", c, ev, EventImplausible)
		}
		if c, _ := cpuSample(a.Sample(smp(120, 1_000+123_000_000+60_000_000, baselineAt(e1)), base)); c != 60_000_000 {
			t.Errorf("the next plausible growth charged %d, want 60000000", c)
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
	t.Run("a counter at the uint64 maximum", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 0, Horizon: time.Hour}) // no CPU bound
		a.Sample(smp(0, 1_000, baselineAt(e1)), base)
		if c, ev := cpuSample(a.Sample(smp(60, math.MaxUint64, baselineAt(e1)), base)); c != 0 || ev != EventImplausible {
			t.Errorf("a counter at 2^64-1 charged %d (%q), want 0", c, ev)
		}
		if got := a.Refused()[RefusedAbsurd]; got != 1 {
			t.Errorf("refused absurd = %d, want 1", got)
		}
	})
	t.Run("unbounded counter at an absurd value", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		a.Sample(counterSmp(0, e1, map[Counter]uint64{CounterNetTxBytes: 1_000}), base)
		cs, _ := a.Sample(counterSmp(60, e1, map[Counter]uint64{CounterNetTxBytes: math.MaxUint64}), base)
		if c, _ := cs.Of(CounterID{Counter: CounterNetTxBytes}); c.Value != 0 {
			t.Errorf("bytes at 2^64-1 charged %d, want 0", c.Value)
		}
	})
	t.Run("tail growth past the bound", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		a.Sample(smp(0, 1_000, baselineAt(e1)), base)
		if c, how, first := cpuEnd(a.End(ended(30, 1e12), base)); c != 0 || how != EndImplausible || !first {
			t.Errorf("End = %d %q %v, want nothing, %q", c, how, first, EndImplausible)
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
	t.Run("a plausible tail is charged", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		a.Sample(smp(0, 1_000, baselineAt(e1)), base)
		if c, how, _ := cpuEnd(a.End(ended(30, 1_000+60_000_000, func(e *sandboxstatsv1.EndedActivation) { e.CpuUsec = proto.Uint64(1_000 + 60_000_000) }), base)); c != 60_000_000 || how != EndTail {
			t.Errorf("End = %d %q, want the 60000000 tail", c, how)
		}
	})
}

// TestPlausibilityBounds: bytes and counts (network, block IO, OOM kills)
// have a plausibility bound per second of the window (MaxBytesPerSecond,
// MaxCountsPerSecond), applied to heads, bodies, resets and tails alike: a
// counter past it charges nothing and is counted; each counter is judged
// on its own, so the sample's other counters are charged.
func TestPlausibilityBounds(t *testing.T) {
	e1 := base.Add(-time.Hour)
	tx := CounterID{Counter: CounterNetTxBytes}
	kills := CounterID{Counter: CounterOOMKills}
	cpu := CounterID{Counter: CounterCPU}
	value := func(cs Charges, id CounterID) uint64 { c, _ := cs.Of(id); return c.Value }
	body := func(t *testing.T, a *Accountant, values map[Counter]uint64) Charges {
		t.Helper()
		first := map[Counter]uint64{}
		for c := range values {
			first[c] = 0
		}
		a.Sample(counterSmp(0, e1, first), base)
		cs, _ := a.Sample(counterSmp(60, e1, values), base)
		return cs
	}
	t.Run("body within 2^40 bytes a second of the window (61 s with the slack)", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		if got := value(body(t, a, map[Counter]uint64{CounterNetTxBytes: 61 << 40}), tx); got != 61<<40 {
			t.Errorf("charged %d, want %d", got, uint64(61<<40))
		}
	})
	t.Run("body past it", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 0, Horizon: time.Hour}) // whatever CPUs
		cs := body(t, a, map[Counter]uint64{CounterNetTxBytes: 61<<40 + 1, CounterOOMKills: 3})
		if got := value(cs, tx); got != 0 {
			t.Errorf("bytes past the bound charged %d, want 0", got)
		}
		if got := value(cs, kills); got != 3 {
			t.Errorf("the sample's plausible kills charged %d, want 3 (each counter on its own)", got)
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
	t.Run("counts past 2^32 a second", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		cs := body(t, a, map[Counter]uint64{CounterOOMKills: 61<<32 + 1, CounterIOWriteOps: 61 << 32})
		if got, ops := value(cs, kills), value(cs, CounterID{Counter: CounterIOWriteOps}); got != 0 || ops != 61<<32 {
			t.Errorf("kills %d (want 0), write IOs %d (want %d)", got, ops, uint64(61<<32))
		}
	})
	t.Run("a reset to a value past it", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		a.Sample(counterSmp(0, e1, map[Counter]uint64{CounterNetTxBytes: 1 << 50}), base)
		cs, _ := a.Sample(counterSmp(60, e1, map[Counter]uint64{CounterNetTxBytes: 1<<62 - 1}), base)
		if got := value(cs, tx); got != 0 { // 2^62-1 > 2^50: growth, not a reset
			t.Errorf("growth to 2^62-1 charged %d", got)
		}
		cs, _ = a.Sample(counterSmp(120, e1, map[Counter]uint64{CounterNetTxBytes: 1 << 60}), base)
		if got := value(cs, tx); got != 0 {
			t.Errorf("a reset to 2^60 in a minute charged %d, want 0", got)
		}
		cs, _ = a.Sample(counterSmp(180, e1, map[Counter]uint64{CounterNetTxBytes: 1 << 20}), base)
		if got := value(cs, tx); got != 1<<20 {
			t.Errorf("a plausible reset charged %d, want %d", got, 1<<20)
		}
		if got := a.Refused()[RefusedGrowth]; got != 2 {
			t.Errorf("refused growth = %d, want 2", got)
		}
	})
	t.Run("head", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		e := base.Add(time.Minute) // 10 s before the sample at 70 s
		cs, _ := a.Sample(counterSmp(70, e, map[Counter]uint64{CounterNetTxBytes: 10<<40 + 1, CounterNetRxBytes: 10 << 40}), base)
		if got, rx := value(cs, tx), value(cs, CounterID{Counter: CounterNetRxBytes}); got != 0 || rx != 10<<40 {
			t.Errorf("head: tx %d (want 0), rx %d (want %d)", got, rx, uint64(10<<40))
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
	t.Run("tail: that counter refused, the CPU charged", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour})
		s := smp(0, 1_000, baselineAt(e1))
		setters[CounterNetTxBytes](s, 0)
		a.Sample(s, base)
		e := ended(30, 1_000+1_000_000, func(e *sandboxstatsv1.EndedActivation) { e.CpuUsec = proto.Uint64(1_000 + 1_000_000) })
		setters[CounterNetTxBytes](e.Final, 1<<61)
		cs, how, _ := a.End(e, base)
		if value(cs, tx) != 0 || value(cs, cpu) != 1_000_000 || how != EndTail {
			t.Errorf("End: tx %d (want 0), CPU %d %q (want 1000000 tail)", value(cs, tx), value(cs, cpu), how)
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
	t.Run("CPU refused, the sample's bytes charged", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		s0 := smp(0, 1_000, baselineAt(e1))
		setters[CounterNetTxBytes](s0, 0)
		a.Sample(s0, base)
		s1 := smp(60, 1_000+200_000_000, baselineAt(e1)) // 200 s in 60 s on 2 CPUs
		setters[CounterNetTxBytes](s1, 5<<20)
		cs, ev := a.Sample(s1, base)
		if value(cs, cpu) != 0 || ev != EventImplausible || value(cs, tx) != 5<<20 {
			t.Errorf("CPU %d (%q), tx %d; want 0 (%q), %d", value(cs, cpu), ev, value(cs, tx), EventImplausible, 5<<20)
		}
	})
	t.Run("an implausible stall counter, the sample's CPU charged", func(t *testing.T) {
		a := NewAccountant(AccountantConfig{Started: started, CPUs: 2, Horizon: time.Hour})
		s0 := smp(0, 1_000, baselineAt(e1))
		setters[CounterPressureIOSome](s0, 0)
		a.Sample(s0, base)
		s1 := smp(60, 1_000+30_000_000, baselineAt(e1)) // 30 s of CPU in 60 s
		setters[CounterPressureIOSome](s1, 500_000_000) // 500 s of stall in 60 s on 2 CPUs
		cs, ev := a.Sample(s1, base)
		if stall := value(cs, CounterID{Counter: CounterPressureIOSome}); value(cs, cpu) != 30_000_000 || ev != EventNone || stall != 0 {
			t.Errorf("CPU %d (%q), io stall %d; want 30000000 (%q), 0", value(cs, cpu), ev, stall, EventNone)
		}
		if got := a.Refused()[RefusedGrowth]; got != 1 {
			t.Errorf("refused growth = %d, want 1", got)
		}
	})
}

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

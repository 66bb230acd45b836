package rate

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// restarted returns an Accountant made from a's state after a JSON round
// trip, as a poller restarted with its state file has it.
func restarted(t *testing.T, a *Accountant, cfg AccountantConfig, now time.Time) *Accountant {
	t.Helper()
	b, err := json.Marshal(a.Export())
	if err != nil {
		t.Fatal(err)
	}
	var st AccountantState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	n := NewAccountant(cfg)
	if err := n.Import(st, now); err != nil {
		t.Fatalf("Import: %v", err)
	}
	if diff := cmp.Diff(a.Export().Ended, n.Export().Ended); diff != "" {
		t.Errorf("ended after the round trip (-before +after):\n%s", diff)
	}
	return n
}

// TestAccountantAcrossRestart: an Accountant restarted from its state
// charges, at the next sample, the growth since what it had charged (the
// usage while no poller ran), and no ended record twice; the time no
// poller ran does not count toward the horizon.
func TestAccountantAcrossRestart(t *testing.T) {
	now := base
	cfg := AccountantConfig{Started: started, CPUs: 2, Horizon: 2 * time.Hour}
	e := baselineAt(base.Add(-time.Hour))
	a := NewAccountant(cfg)
	a.Sample(smp(0, 1_000_000, e), now)
	if c, _ := cpuSample(a.Sample(smp(10, 1_300_000, e), now.Add(10*time.Second))); c != 300_000 {
		t.Fatalf("body before the restart charged %d", c)
	}
	// Down for three hours (past the horizon): the account is kept.
	later := now.Add(3 * time.Hour)
	n := restarted(t, a, cfg, later)
	if c, ev := cpuSample(n.Sample(smp(3*3600+60, 2_000_000, e), later)); c != 700_000 || ev != EventNone {
		t.Fatalf("first sample after the restart = %d %q, want the 700000 used while down", c, ev)
	}
	if c, how, first := cpuEnd(n.End(ended(3*3600+70, 2_100_000), later)); c != 100_000 || how != EndTail || !first {
		t.Fatalf("End after the restart = %d %q %v, want the 100000 tail", c, how, first)
	}
	n2 := restarted(t, n, cfg, later.Add(time.Minute))
	if c, _, first := cpuEnd(n2.End(ended(3*3600+70, 2_100_000), later.Add(time.Minute))); c != 0 || first {
		t.Fatalf("the record charged before the restart charged %d again (first %v)", c, first)
	}
	if live, ended := n2.Len(); live != 0 || ended != 1 {
		t.Errorf("after the end: %d live, %d ended; want 0 and 1", live, ended)
	}
}

// TestAccountantImportRefusesForeign: a state that does not hold together
// is refused whole, and the Accountant keeps its own memory.
func TestAccountantImportRefusesForeign(t *testing.T) {
	k := KeyState{ActorUID: "a1", Source: 1, EpochUnixNano: 5}
	for _, tc := range []struct {
		name string
		st   AccountantState
		want string
	}{
		{"unknown counter", AccountantState{Live: []AccountState{{Key: k, Counters: []CounterState{{Counter: NumCounters}}}}}, "not known"},
		{"negative counter", AccountantState{Live: []AccountState{{Key: k, Counters: []CounterState{{Counter: -1}}}}}, "not known"},
		{"interface name too long", AccountantState{Live: []AccountState{{Key: k, Counters: []CounterState{{Counter: CounterNetRxBytes, Interface: strings.Repeat("x", MaxInterfaceName+1)}}}}}, "not known"},
		{"activation twice", AccountantState{Live: []AccountState{{Key: k}, {Key: k}}}, "twice"},
		{"counter twice", AccountantState{Live: []AccountState{{Key: k, Counters: []CounterState{{Counter: CounterCPU}, {Counter: CounterCPU}}}}}, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant(AccountantConfig{Started: started, Horizon: time.Hour})
			a.Sample(smp(0, 1_000, baselineAt(base)), base)
			err := a.Import(tc.st, base)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Import = %v, want an error with %q", err, tc.want)
			}
			if live, _ := a.Len(); live != 1 {
				t.Errorf("after a refused Import: %d live, want its own 1", live)
			}
		})
	}
}

// TestAccountantImportBoundsEnded: past MaxEnded, the oldest ended are
// dropped.
func TestAccountantImportBoundsEnded(t *testing.T) {
	var st AccountantState
	for i := range 10 {
		st.Ended = append(st.Ended, EndedState{Key: KeyState{ActorUID: "a", EpochUnixNano: int64(i)}, ChargedUnixNano: int64(i)})
	}
	a := NewAccountant(AccountantConfig{Started: started, Horizon: time.Hour, MaxEnded: 4})
	if err := a.Import(st, base); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(st.Ended[6:], a.Export().Ended); diff != "" {
		t.Errorf("ended kept (-want +got):\n%s", diff)
	}
}

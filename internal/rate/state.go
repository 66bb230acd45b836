package rate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/foreign"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// AccountantState is what an Accountant charged, for a poller that keeps it
// across its restarts (statsagent --state-dir): per live activation, each
// counter's value charged up to; the ended activations charged, by when.
// An Accountant made from it (Import) continues every account where it
// was: the usage while no poller ran is charged at the next sample, and no
// record is charged twice.
type AccountantState struct {
	Live  []AccountState `json:"live"`
	Ended []EndedState   `json:"ended"`
}

// KeyState is an ActivationKey as a state file holds it.
type KeyState struct {
	ActorUID      string `json:"actor_uid"`
	Source        int32  `json:"source"`
	EpochUnixNano int64  `json:"epoch_unix_nano"`
}

func (k KeyState) key() ActivationKey {
	return ActivationKey{ActorUID: keyUID(k.ActorUID), Source: sandboxstatsv1.StatsSource(k.Source), EpochUnixNano: k.EpochUnixNano}
}

func keyState(k ActivationKey) KeyState {
	return KeyState{ActorUID: k.ActorUID, Source: int32(k.Source), EpochUnixNano: k.EpochUnixNano}
}

// AccountState is one live activation's account.
type AccountState struct {
	Key              KeyState       `json:"key"`
	History          bool           `json:"history,omitempty"`
	LastSeenUnixNano int64          `json:"last_seen_unix_nano"`
	Counters         []CounterState `json:"counters"`
}

// CounterState is one counter of an account: the own (or, without a
// baseline, raw) value charged up to and when it was observed.
type CounterState struct {
	Counter          Counter `json:"counter"`
	Interface        string  `json:"interface,omitempty"`
	WithBaseline     bool    `json:"with_baseline,omitempty"`
	Last             uint64  `json:"last"`
	LastObservedNano int64   `json:"last_observed_unix_nano"`
}

// EndedState is one ended activation charged, and when (the poller's
// clock).
type EndedState struct {
	Key             KeyState `json:"key"`
	ChargedUnixNano int64    `json:"charged_unix_nano"`
}

// Export returns what a charged: its live accounts (by key) and its ended
// activations (oldest charged first).
func (a *Accountant) Export() AccountantState {
	st := AccountantState{Live: make([]AccountState, 0, len(a.live)), Ended: make([]EndedState, 0, len(a.endedOrder))}
	for k, acc := range a.live {
		as := AccountState{Key: keyState(k), History: acc.history, LastSeenUnixNano: acc.lastSeen.UnixNano(),
			Counters: make([]CounterState, 0, len(acc.counters))}
		for id, c := range acc.counters {
			as.Counters = append(as.Counters, CounterState{Counter: id.Counter, Interface: id.Interface, WithBaseline: c.withBaseline,
				Last: c.last, LastObservedNano: c.lastObserved})
		}
		slices.SortFunc(as.Counters, func(x, y CounterState) int {
			return cmp.Or(cmp.Compare(x.Counter, y.Counter), strings.Compare(x.Interface, y.Interface))
		})
		st.Live = append(st.Live, as)
	}
	slices.SortFunc(st.Live, func(x, y AccountState) int { return compareKeys(x.Key, y.Key) })
	for _, k := range a.endedOrder {
		st.Ended = append(st.Ended, EndedState{Key: keyState(k), ChargedUnixNano: a.ended[k].UnixNano()})
	}
	return st
}

func compareKeys(x, y KeyState) int {
	return cmp.Or(strings.Compare(x.ActorUID, y.ActorUID), cmp.Compare(x.Source, y.Source), cmp.Compare(x.EpochUnixNano, y.EpochUnixNano))
}

// Import makes a's memory st (a's own is replaced), as a state file held
// it, seen again at now: each live activation is kept for the horizon
// after now (the time no poller ran does not count toward it: nobody could
// see it), and its next sample charges its growth since what was charged. A state
// that does not hold together (a counter this build does not know, a
// duplicate key, an interface name past MaxInterfaceName) is refused
// whole: a foreign file is not half believed. Past MaxEnded the oldest
// ended are dropped. A network counter kept in the other form than a's
// PerInterface (the flag changed across the restart) is dropped, its
// activation marked as having a history: it is charged from its next
// sample on, never its head again.
func (a *Accountant) Import(st AccountantState, now time.Time) error {
	live := make(map[ActivationKey]*account, len(st.Live))
	for i, as := range st.Live {
		k := as.Key.key()
		if _, dup := live[k]; dup {
			return fmt.Errorf("rate: state: live[%d]: activation %s epoch %d twice", i, foreign.Quote(as.Key.ActorUID), as.Key.EpochUnixNano)
		}
		// Last seen when it was saved (a sample without its observed time
		// is judged from it, the time down included), kept from pruning
		// until the horizon after now.
		seen := time.Unix(0, as.LastSeenUnixNano)
		if as.LastSeenUnixNano <= 0 || seen.After(now) { // a foreign file's: not believed
			seen = now
		}
		acc := &account{counters: make(map[CounterID]*counterAccount, len(as.Counters)), history: as.History,
			lastSeen: seen, restored: now}
		for j, cs := range as.Counters {
			if cs.Counter < 0 || cs.Counter >= NumCounters || len(cs.Interface) > MaxInterfaceName {
				return fmt.Errorf("rate: state: live[%d].counters[%d]: counter %d (interface %d bytes) not known", i, j, cs.Counter, len(cs.Interface))
			}
			if cs.Counter.IsNetwork() && (cs.Interface != "") != a.cfg.PerInterface {
				// Kept in the other form (PerInterface changed across the
				// restart): no account of this form to continue. The
				// activation is taken as one with a history, so that its
				// network counters start from their next sample instead
				// of charging their head again.
				acc.history = true
				continue
			}
			id := CounterID{Counter: cs.Counter, Interface: cs.Interface}
			if _, dup := acc.counters[id]; dup {
				return fmt.Errorf("rate: state: live[%d].counters[%d]: counter %d twice", i, j, cs.Counter)
			}
			acc.counters[id] = &counterAccount{withBaseline: cs.WithBaseline, last: cs.Last, lastObserved: cs.LastObservedNano}
		}
		live[k] = acc
	}
	ended := make(map[ActivationKey]time.Time, len(st.Ended))
	order := make([]ActivationKey, 0, min(len(st.Ended), a.cfg.MaxEnded))
	for _, es := range st.Ended[max(0, len(st.Ended)-a.cfg.MaxEnded):] {
		k := es.Key.key()
		if _, dup := ended[k]; dup {
			continue
		}
		ended[k] = time.Unix(0, es.ChargedUnixNano)
		order = append(order, k)
	}
	a.live, a.ended, a.endedOrder = live, ended, order
	return nil
}

package nodeagent

// This file is where statsd moves CPU from one container entry to another
// within an activation: identity merges an exited container into the
// exited entry of its name (a restart under the same name, newest id kept)
// and folds the oldest exited entries into identity.FoldedExitedID; the
// budget's cut folds a big sample's exited entries into that entry too,
// for that sample only. Each entry has its own account (containers.go), so
// an entry that grows by what another brought would charge that CPU again.
//
// So the agent feeds each account not the entry's counter but a "fed"
// value, kept per activation in a ledger: an entry's fed value is its
// counter less what other entries were already charged of it. It holds
// that the fed values of the entries listed plus those of the entries that
// left the list (their accounts keep what they were charged) equal the
// counters listed: the containers' series plus POD stay the pod's CPU. An
// exited entry's fed value never goes down (no counter reset), a live
// one's follows its counter (a real reset stays one).

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Bounds of a ledger: the entries that left the list remembered (so one
// listed again, as after the budget's transient fold, resumes its fed
// value), and of a state file's.
const (
	maxLedgerGone    = 64
	maxLedgerEntries = 1024
	maxLedgers       = 1 << 14
)

// fedEntry is one container entry of a ledger: its counter as last
// reported (µs) and the value its account was fed.
type fedEntry struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Reported uint64 `json:"reported"`
	Fed      uint64 `json:"fed"`
	Exited   bool   `json:"exited,omitempty"`
}

// containerLedger is what an activation's container accounts were fed.
type containerLedger struct {
	Listed []fedEntry `json:"listed"`
	// Gone left the list, newest last (at most maxLedgerGone); GoneFed sums
	// the fed values of all that left, those forgotten too.
	Gone     []fedEntry `json:"gone,omitempty"`
	GoneFed  uint64     `json:"gone_fed"`
	lastSeen time.Time
}

// fedValues returns the values to feed the accounts of cs, a sample's (or
// a final's) containers of activation k (0 and false for one without a CPU
// counter), and records them. A list without a CPU counter anywhere
// changes nothing.
func (m *metrics) fedValues(k rate.ActivationKey, cs []*sandboxstatsv1.ContainerStats, now time.Time) ([]uint64, []bool) {
	if m.ledgers == nil {
		m.ledgers = map[rate.ActivationKey]*containerLedger{}
	}
	led := m.ledgers[k]
	if led == nil {
		led = &containerLedger{}
		m.ledgers[k] = led
	}
	led.lastSeen = now
	return led.feed(cs)
}

// feed is fedValues for one ledger.
func (led *containerLedger) feed(cs []*sandboxstatsv1.ContainerStats) ([]uint64, []bool) {
	fed, has := make([]uint64, len(cs)), make([]bool, len(cs))
	lo := make([]uint64, len(cs))
	prev := make(map[string]fedEntry, len(led.Listed))
	for _, e := range led.Listed {
		prev[e.ID] = e
	}
	var (
		listed []fedEntry
		total  uint64
	)
	for i, c := range cs {
		if c.CpuUsageUsec == nil {
			continue
		}
		rep := c.GetCpuUsageUsec()
		last, known := prev[c.GetId()]
		if known {
			delete(prev, c.GetId())
		} else if j := indexEntry(led.Gone, c.GetId()); j >= 0 {
			last, known = led.Gone[j], true
			led.Gone = append(led.Gone[:j:j], led.Gone[j+1:]...)
			led.GoneFed -= min(led.GoneFed, last.Fed)
		}
		has[i] = true
		total = addSat(total, rep)
		switch {
		case !known:
			fed[i] = rep // a new account: charged from its baseline
		case c.GetExited():
			// Never down; at most its counter (more only when it was
			// fed more before).
			lo[i] = last.Fed
			fed[i] = max(last.Fed, min(rep, addSat(last.Fed, rep-min(rep, last.Reported))))
		default:
			fed[i] = rep - min(rep, last.Reported-min(last.Reported, last.Fed))
		}
	}
	// What left the list now: its account keeps what it was fed.
	left := map[string]bool{}
	for _, e := range led.Listed {
		if _, gone := prev[e.ID]; gone {
			led.Gone = append(led.Gone, e)
			led.GoneFed = addSat(led.GoneFed, e.Fed)
			if e.Name != "" {
				left[e.Name] = true
			}
		}
	}
	if n := len(led.Gone) - maxLedgerGone; n > 0 {
		led.Gone = led.Gone[n:]
	}
	target := total - min(total, led.GoneFed)
	var sum uint64
	for i := range cs {
		sum = addSat(sum, fed[i])
	}
	if sum > target {
		// CPU moved into exited entries from those that left: taken off
		// the entry of the name that left first, then the folded entry,
		// then any exited one, none below what it was fed.
		excess := sum - target
		for _, pick := range []func(*sandboxstatsv1.ContainerStats) bool{
			func(c *sandboxstatsv1.ContainerStats) bool { return left[c.GetName()] },
			func(c *sandboxstatsv1.ContainerStats) bool { return c.GetId() == identity.FoldedExitedID },
			func(*sandboxstatsv1.ContainerStats) bool { return true },
		} {
			for i, c := range cs {
				if excess == 0 || !has[i] || !c.GetExited() || !pick(c) {
					continue
				}
				d := min(excess, fed[i]-lo[i])
				fed[i] -= d
				excess -= d
			}
		}
	} else if sum < target {
		// CPU moved out of entries that cannot give it back (an exited
		// one never goes down): the live ones first, then the exited ones,
		// none above its counter.
		deficit := target - sum
		for _, exited := range []bool{false, true} {
			for i, c := range cs {
				if deficit == 0 || !has[i] || c.GetExited() != exited {
					continue
				}
				d := min(deficit, c.GetCpuUsageUsec()-min(c.GetCpuUsageUsec(), fed[i]))
				fed[i] += d
				deficit -= d
			}
		}
	}
	for i, c := range cs {
		if has[i] {
			listed = append(listed, fedEntry{ID: c.GetId(), Name: c.GetName(), Reported: c.GetCpuUsageUsec(), Fed: fed[i], Exited: c.GetExited()})
		}
	}
	led.Listed = listed
	return fed, has
}

func indexEntry(es []fedEntry, id string) int {
	for i, e := range es {
		if e.ID == id {
			return i
		}
	}
	return -1
}

// pruneLedgers forgets the ledgers of activations not seen within the
// horizon (their accounts are forgotten alike).
func (m *metrics) pruneLedgers(now time.Time) {
	for k, led := range m.ledgers {
		if now.Sub(led.lastSeen) > max(m.cfg.EndedHorizon, m.cfg.Grace) {
			delete(m.ledgers, k)
		}
	}
}

// ledgerState is one ledger in the state file.
type ledgerState struct {
	ActorUID         string `json:"actor_uid"`
	Source           int32  `json:"source"`
	EpochUnixNano    int64  `json:"epoch_unix_nano"`
	LastSeenUnixNano int64  `json:"last_seen_unix_nano"`
	containerLedger         // its exported fields
}

// exportLedgers returns the ledgers as the state file holds them.
func (m *metrics) exportLedgers() []ledgerState {
	out := make([]ledgerState, 0, len(m.ledgers))
	for k, led := range m.ledgers {
		out = append(out, ledgerState{ActorUID: k.ActorUID, Source: int32(k.Source), EpochUnixNano: k.EpochUnixNano,
			LastSeenUnixNano: led.lastSeen.UnixNano(), containerLedger: *led})
	}
	slices.SortFunc(out, func(x, y ledgerState) int {
		return cmp.Or(strings.Compare(x.ActorUID, y.ActorUID), cmp.Compare(x.Source, y.Source), cmp.Compare(x.EpochUnixNano, y.EpochUnixNano))
	})
	return out
}

// decodeLedgers validates a state file's ledgers and returns them, seen
// no later than now.
func decodeLedgers(ls []ledgerState, now time.Time) (map[rate.ActivationKey]*containerLedger, error) {
	if len(ls) > maxLedgers {
		return nil, fmt.Errorf("%d container ledgers (at most %d)", len(ls), maxLedgers)
	}
	out := make(map[rate.ActivationKey]*containerLedger, len(ls))
	for i, l := range ls {
		if len(l.ActorUID) > 4*maxLabelBytes || len(l.Listed) > maxLedgerEntries || len(l.Gone) > maxLedgerGone {
			return nil, fmt.Errorf("container_ledgers[%d]: %d listed, %d gone, a uid of %d bytes", i, len(l.Listed), len(l.Gone), len(l.ActorUID))
		}
		for _, e := range append(l.Listed[:len(l.Listed):len(l.Listed)], l.Gone...) {
			if len(e.ID) > 4*maxLabelBytes || len(e.Name) > 4*maxLabelBytes {
				return nil, fmt.Errorf("container_ledgers[%d]: an entry's id or name over %d bytes", i, 4*maxLabelBytes)
			}
		}
		led := l.containerLedger
		led.lastSeen = time.Unix(0, l.LastSeenUnixNano)
		if led.lastSeen.After(now) {
			led.lastSeen = now
		}
		out[rate.ActivationKey{ActorUID: l.ActorUID, Source: sandboxstatsv1.StatsSource(l.Source), EpochUnixNano: l.EpochUnixNano}] = &led
	}
	return out, nil
}

package rate

import (
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ActivationKey names one activation's account: its actor, the source its
// counter comes from (different sources are different counters) and its
// epoch.
type ActivationKey struct {
	ActorUID      string
	Source        sandboxstatsv1.StatsSource
	EpochUnixNano int64
}

// KeyOf returns the activation a sample belongs to.
func KeyOf(s *sandboxstatsv1.WorkloadStatsSample) ActivationKey {
	return ActivationKey{ActorUID: s.GetActorUid(), Source: s.GetSource(), EpochUnixNano: s.GetEpochUnixNano()}
}

// EndedKeyOf returns the activation an ended record closes.
func EndedKeyOf(e *sandboxstatsv1.EndedActivation) ActivationKey {
	return ActivationKey{ActorUID: e.GetIdentity().GetActorUid(), Source: e.GetSource(), EpochUnixNano: e.GetEpochUnixNano()}
}

// AccountantConfig configures an Accountant.
type AccountantConfig struct {
	// Started is when this poller started: an activation whose epoch began
	// before it may have been charged by a previous poller process, so its
	// usage before the first sample is not charged again.
	Started time.Time
	// CPUs bounds how much CPU an activation can have used (the node's CPU
	// count); 0 disables the bound.
	CPUs int
	// Horizon is how long an activation's account is remembered after it
	// was last seen, and an ended activation after its end: a sample of it
	// within the horizon continues its account, and its record is charged
	// once however often statsd serves it. A record that ended longer ago
	// is ignored, so the horizon must exceed statsd's --ended-retention (and
	// the longest a daemon may go unpolled).
	Horizon time.Duration
}

// Accountant charges each activation's CPU exactly once, from its first to
// its last microsecond, to a counter that never decreases. It works on an
// activation's own CPU: the sample's cpu_usage_usec minus the epoch baseline
// (epoch_baseline; 0 for a source whose counters start with the epoch).
//
//   - Head: the first sample of an activation whose epoch began after the
//     poller started charges its own CPU in full (the usage from the epoch
//     start to that sample), if it could have been used in the time since
//     the baseline (at most CPUs x that time; a larger value is a cgroup
//     reused across epochs and becomes the baseline). An activation that
//     began before the poller started charges nothing at first sight: a
//     previous poller process charged it until it stopped.
//   - Body: each later sample charges the growth of the own CPU since the
//     last sample. A decrease within the epoch is a counter reset: the new
//     value is charged in full if it could have been used since the last
//     sample.
//   - Tail: the ended record (End) charges the final own CPU minus what the
//     last sample charged up to, once: repeated records of the same
//     activation charge nothing.
//   - An activation is remembered for the horizon after it was last seen,
//     so one whose daemon missed sweeps continues where it was, never
//     charged twice. An activation never sampled, whose epoch
//     began after the poller started, is charged its whole own CPU (the
//     activation that started and ended between two sweeps).
//   - A sample without a baseline (a guest agent whose first read has not
//     succeeded, or an old statsd) charges nothing at first sight and then
//     deltas of the raw counter; its end charges the raw final minus the
//     last raw value.
//
// An Accountant is not safe for concurrent use.
type Accountant struct {
	cfg   AccountantConfig
	live  map[ActivationKey]*account
	ended map[ActivationKey]time.Time // charged ends, by end time
}

type account struct {
	// withBaseline: own values are counter minus baseline; else raw
	// counter values (delta mode).
	withBaseline bool
	last         uint64 // the own (or raw) value charged up to
	lastObserved int64
	lastSeen     time.Time
}

// NewAccountant returns an empty Accountant.
func NewAccountant(cfg AccountantConfig) *Accountant {
	return &Accountant{cfg: cfg, live: make(map[ActivationKey]*account), ended: make(map[ActivationKey]time.Time)}
}

// EventEnded: the sample belongs to an activation already charged to its
// end; it charges nothing.
const EventEnded Event = "ended"

// ownCPU returns a sample's own CPU (counter minus the epoch baseline) and
// whether a baseline was known. A cgroup sample without a baseline (an old
// statsd) counts from the epoch start, as the cgroup source always has.
func ownCPU(s *sandboxstatsv1.WorkloadStatsSample) (own, sinceUnixNano int64, withBaseline bool, reset bool) {
	cpu := s.GetCpuUsageUsec()
	b := s.GetEpochBaseline()
	switch {
	case b.GetKind() == sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ && b.GetFirstRead().CpuUsageUsec != nil:
		base := b.GetFirstRead().GetCpuUsageUsec()
		if cpu < base {
			return 0, b.GetObservedAtUnixNano(), true, true
		}
		return int64(cpu - base), b.GetObservedAtUnixNano(), true, false
	case b.GetKind() == sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START,
		b == nil && s.GetSource() == sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP:
		return int64(cpu), s.GetEpochUnixNano(), true, false
	}
	return int64(cpu), 0, false, false
}

// Sample records s, seen at now (the poller's clock, for the grace), and
// returns the CPU it charges in microseconds and how it relates to the
// previous sample of its activation.
func (a *Accountant) Sample(s *sandboxstatsv1.WorkloadStatsSample, now time.Time) (chargedUsec uint64, ev Event) {
	switch {
	case !Measured(s):
		return 0, EventNotMeasured
	case s.CpuUsageUsec == nil:
		return 0, EventCPUAbsent
	}
	key := KeyOf(s)
	if _, done := a.ended[key]; done {
		return 0, EventEnded
	}
	own, since, withBase, belowBase := ownCPU(s)
	if belowBase {
		// The counter went below the baseline: the guest's counter was reset
		// within the epoch; its value is usage not yet charged.
		withBase, own = false, int64(s.GetCpuUsageUsec())
	}
	acc := a.live[key]
	if acc == nil {
		acc = &account{withBaseline: withBase}
		a.live[key] = acc
		ev = EventFirst
		if withBase && !time.Unix(0, s.GetEpochUnixNano()).Before(a.cfg.Started) {
			chargedUsec = a.plausible(uint64(own), since, s.GetObservedAtUnixNano())
		}
	} else {
		switch {
		case withBase != acc.withBaseline:
			// The baseline appeared or changed mid-activation (statsd
			// restarted before persisting it): the values are not
			// comparable; take this one as the new starting point.
			acc.withBaseline = withBase
			ev = EventCounterReset
		case uint64(own) >= acc.last:
			chargedUsec = uint64(own) - acc.last
		default:
			ev = EventCounterReset
			chargedUsec = a.plausible(uint64(own), acc.lastObserved, s.GetObservedAtUnixNano())
		}
	}
	acc.last, acc.lastObserved, acc.lastSeen = uint64(own), s.GetObservedAtUnixNano(), now
	return chargedUsec, ev
}

// plausible returns v if it could have been used between sinceUnixNano and
// atUnixNano on CPUs processors, else 0.
func (a *Accountant) plausible(v uint64, sinceUnixNano, atUnixNano int64) uint64 {
	if a.cfg.CPUs <= 0 {
		return v
	}
	window := atUnixNano - sinceUnixNano
	if window <= 0 || v/uint64(a.cfg.CPUs) > uint64(window)/1000 {
		return 0
	}
	return v
}

// EndEvent says how an ended activation was charged.
type EndEvent string

const (
	// EndTail: the remainder from the last sample to the final.
	EndTail EndEvent = "tail"
	// EndWhole: never sampled, begun after the poller started: the whole
	// activation.
	EndWhole EndEvent = "whole"
	// EndUnseenOld: never sampled, begun before the poller started: what a
	// previous poller charged is unknown, so nothing.
	EndUnseenOld EndEvent = "unseen-before-start"
	// EndNoCPU: the record has no CPU (no final, or no counter).
	EndNoCPU EndEvent = "no-cpu"
	// EndImplausible: more CPU than the activation's time allows.
	EndImplausible EndEvent = "implausible"
)

// End charges an ended activation's tail once. first is false (and nothing
// charged) for a record already charged, one that ended before the poller
// started (a previous poller's) or longer ago than the horizon.
func (a *Accountant) End(e *sandboxstatsv1.EndedActivation, now time.Time) (chargedUsec uint64, ev EndEvent, first bool) {
	key := EndedKeyOf(e)
	end := time.Unix(0, e.GetEndUnixNano())
	if _, done := a.ended[key]; done || end.Before(a.cfg.Started) || now.Sub(end) > a.cfg.Horizon {
		return 0, "", false
	}
	a.ended[key] = end
	acc := a.live[key]
	delete(a.live, key)
	final := e.GetFinal()
	switch {
	case acc != nil && !acc.withBaseline && final.CpuUsageUsec != nil:
		if raw := final.GetCpuUsageUsec(); raw >= acc.last {
			return raw - acc.last, EndTail, true
		}
		return 0, EndTail, true
	case e.CpuUsec == nil:
		return 0, EndNoCPU, true
	case acc != nil:
		if own := e.GetCpuUsec(); own >= acc.last {
			return own - acc.last, EndTail, true
		}
		return 0, EndTail, true
	case time.Unix(0, e.GetEpochUnixNano()).Before(a.cfg.Started):
		return 0, EndUnseenOld, true
	}
	since := e.GetEpochUnixNano() + e.GetBaselineDelayNanos()
	if v := a.plausible(e.GetCpuUsec(), since, e.GetEndUnixNano()); v > 0 || e.GetCpuUsec() == 0 {
		return v, EndWhole, true
	}
	return 0, EndImplausible, true
}

// Prune forgets the activations not seen, and the ended ones not ended,
// within the horizon, and returns the live ones forgotten.
func (a *Accountant) Prune(now time.Time) []ActivationKey {
	var gone []ActivationKey
	for k, acc := range a.live {
		if now.Sub(acc.lastSeen) > a.cfg.Horizon {
			delete(a.live, k)
			gone = append(gone, k)
		}
	}
	for k, end := range a.ended {
		if now.Sub(end) > a.cfg.Horizon {
			delete(a.ended, k)
		}
	}
	return gone
}

// Len returns the activations remembered, live and ended.
func (a *Accountant) Len() (live, ended int) { return len(a.live), len(a.ended) }

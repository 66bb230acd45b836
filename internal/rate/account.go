package rate

import (
	"math"
	"math/bits"
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ActivationKey names one activation's account: its actor (its uid cut at
// 253 bytes, as the agent's labels are: a daemon's longer uid costs no more
// than a label), the source its counter comes from (different sources are
// different counters) and its epoch.
type ActivationKey struct {
	ActorUID      string
	Source        sandboxstatsv1.StatsSource
	EpochUnixNano int64
}

// KeyOf returns the activation a sample belongs to.
func KeyOf(s *sandboxstatsv1.WorkloadStatsSample) ActivationKey {
	return ActivationKey{ActorUID: keyUID(s.GetActorUid()), Source: s.GetSource(), EpochUnixNano: s.GetEpochUnixNano()}
}

// EndedKeyOf returns the activation an ended record closes.
func EndedKeyOf(e *sandboxstatsv1.EndedActivation) ActivationKey {
	return ActivationKey{ActorUID: keyUID(e.GetIdentity().GetActorUid()), Source: e.GetSource(), EpochUnixNano: e.GetEpochUnixNano()}
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
	// was last seen, and an ended activation after this Accountant charged
	// its record (by the caller's clock, never the daemon's): a sample of it
	// within the horizon continues its account, and its record is charged
	// once however often statsd serves it. A record that ended longer ago
	// is ignored, so the horizon must exceed statsd's --ended-retention (and
	// the longest a daemon may go unpolled).
	Horizon time.Duration
	// PerInterface accounts the network counters per interface (by name, at
	// most MaxInterfaces of a sample, loopback never) instead of their total.
	PerInterface bool
	// HeadSlack widens the window a head is bounded by to begin this long
	// before the epoch (0: none; the node agent uses DefaultHeadSlack): a
	// sandbox's cgroup is made, and its sandbox boots, before the
	// launcher's Run binds it, and that boot is the activation's usage too.
	// A cgroup reused across epochs carries far more history than that and
	// is still refused.
	HeadSlack time.Duration
	// MaxEnded bounds the ended records remembered (DefaultMaxEnded where
	// zero): past it the oldest charged is forgotten first, and counted
	// (RefusedEndedEvicted).
	MaxEnded int
}

// DefaultHeadSlack is the HeadSlack the node agent uses: 10 s of boot
// before the Run.
const DefaultHeadSlack = 10 * time.Second

// Accountant charges each activation's counters exactly once, from its
// first to its last microsecond (or byte, packet, kill), to counters that
// never decrease. It works on an activation's own usage: a counter's value
// minus the epoch baseline's value of the same counter (epoch_baseline; 0
// for a source whose counters start with the epoch). Every Counter follows
// the same rules, each on its own; a counter absent from a sample is not
// charged (absent is not zero):
//
//   - Head: the first sample of an activation whose epoch began after the
//     poller started charges its own usage in full (from the epoch start to
//     that sample), if it could have been used in the time since the
//     baseline (CPU and stall time: at most CPUs x that time; periods: one
//     per millisecond). A larger value is a source reused across epochs and
//     becomes the baseline; then the counters without such a tight bound
//     (bytes, packets, kills) of the same activation are not charged from the epoch
//     start either. An activation that began before the poller started
//     charges nothing at first sight: a previous poller process charged it
//     until it stopped.
//   - Body: each later sample charges the growth of the own usage since the
//     last sample. A decrease within the epoch is a counter reset: the new
//     value is charged in full if it could have been used since the last
//     sample (for a byte or count counter: within its plausibility bound,
//     unless a CPU-like counter of the same sample says it could not).
//   - Tail: the ended record (End) charges the final's own usage (for CPU:
//     the record's cpu_usec) minus what the last sample charged up to, once:
//     repeated records of the same activation charge nothing.
//   - An activation is remembered for the horizon after it was last seen,
//     so one whose daemon missed sweeps continues where it was, never
//     charged twice. An activation never sampled, whose epoch began after
//     the poller started, is charged its whole own usage (the activation
//     that started and ended between two sweeps).
//   - Bytes and counts (network, block IO, OOM kills) have a plausibility
//     bound instead of a time bound: MaxBytesPerSecond (2^40) and
//     MaxCountsPerSecond (2^32) per second of the window. It never shows a
//     history (only CPU-like counters do); a head, body, reset or tail
//     past it is a lie.
//   - A counter whose head (plausibility-bounded), body, reset
//     (plausibility-bounded) or tail grew more than its bound allows in
//     the time since the last sample (plus a second) charges nothing and
//     its sample or record is counted once (RefusedGrowth); each counter
//     is judged on its own, so the sample's other counters are charged. A
//     sample or record with any counter at an absurd value (2^62 or more)
//     is untrustworthy as a whole: it charges nothing and is counted
//     (RefusedAbsurd). Either way its values are where the activation
//     continues from, so one daemon's lie never reaches a series it
//     shares with others.
//   - A counter without a baseline (a guest agent whose first read has not
//     succeeded, an old statsd, a baseline read that lacked the counter)
//     charges nothing at first sight and then deltas of the raw counter;
//     its end charges the raw final minus the last raw value.
//
// An Accountant is not safe for concurrent use.
type Accountant struct {
	cfg   AccountantConfig
	live  map[ActivationKey]*account
	ended map[ActivationKey]time.Time // charged ends, by when they were charged (the caller's clock)
	// endedOrder holds ended's keys, oldest charged first (MaxEnded
	// forgets from its front).
	endedOrder []ActivationKey
	refused    refusals
}

// account is one activation's: a value per counter.
type account struct {
	counters map[CounterID]*counterAccount
	// history: a bounded counter's head was more than the activation's time
	// allows, so its source counted before the epoch: no counter of it is
	// charged from the epoch start.
	history  bool
	lastSeen time.Time
	prevSeen time.Time // lastSeen before the sample being charged
	// restored: when a poller restarted from a state that held it (Import):
	// the time no poller ran does not count toward the horizon.
	restored time.Time
}

type counterAccount struct {
	// withBaseline: own values are counter minus baseline; else raw
	// counter values (delta mode).
	withBaseline bool
	last         uint64 // the own (or raw) value charged up to
	lastObserved int64
}

// Charge is what one sample, or one ended record, charged to one counter.
type Charge struct {
	ID CounterID
	// Value is in the counter's unit: µs (CPU, throttled, stall), periods,
	// kills, bytes, packets, errors, drops, IOs.
	Value uint64
	// Event relates a sample to the counter's previous one: EventFirst,
	// EventNone or EventCounterReset (EventNone for an ended record).
	Event Event
}

// Charges are the charges of one sample or record, one per counter it
// carries, in Counter order.
type Charges []Charge

// Of returns the charge of counter id, if there is one.
func (cs Charges) Of(id CounterID) (Charge, bool) {
	for _, c := range cs {
		if c.ID == id {
			return c, true
		}
	}
	return Charge{}, false
}

// CPU returns the CPU charged, in microseconds (0 if none).
func (cs Charges) CPU() uint64 {
	c, _ := cs.Of(CounterID{Counter: CounterCPU})
	return c.Value
}

// NewAccountant returns an empty Accountant.
func NewAccountant(cfg AccountantConfig) *Accountant {
	if cfg.MaxEnded <= 0 {
		cfg.MaxEnded = DefaultMaxEnded
	}
	return &Accountant{cfg: cfg, live: make(map[ActivationKey]*account), ended: make(map[ActivationKey]time.Time)}
}

// EventImplausible: the sample was refused (Refused says why): it charges
// nothing, and the activation continues from its values.
const EventImplausible Event = "implausible"

// EventEnded: the sample belongs to an activation already charged to its
// end; it charges nothing.
const EventEnded Event = "ended"

// ownValue returns counter id's own value in s (v minus the epoch
// baseline's value of the same counter), since when it counted, and
// whether a baseline is known; below is true when v is under the baseline
// (the counter was reset within the epoch). A cgroup sample without a
// baseline (an old statsd) counts from the epoch start, as the cgroup
// source always has.
func ownValue(s *sandboxstatsv1.WorkloadStatsSample, id CounterID, v uint64) (own uint64, sinceUnixNano int64, withBaseline, below bool) {
	b := s.GetEpochBaseline()
	switch {
	case b.GetKind() == sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ:
		base, ok := valueOf(b.GetFirstRead(), id)
		switch {
		case !ok:
			return v, 0, false, false
		case v < base:
			return 0, b.GetObservedAtUnixNano(), true, true
		}
		return v - base, b.GetObservedAtUnixNano(), true, false
	case b.GetKind() == sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START,
		b == nil && s.GetSource() == sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP:
		return v, s.GetEpochUnixNano(), true, false
	}
	return v, 0, false, false
}

// OwnCPU returns the CPU s's activation used itself (its counter minus the
// epoch baseline's), in µs, and whether it is known: false when s has no
// CPU counter or (a guest agent's sample) no baseline to subtract.
func OwnCPU(s *sandboxstatsv1.WorkloadStatsSample) (usec uint64, ok bool) {
	if s.CpuUsageUsec == nil {
		return 0, false
	}
	own, _, withBaseline, _ := ownValue(s, CounterID{Counter: CounterCPU}, s.GetCpuUsageUsec())
	return own, withBaseline
}

// Sample records s, seen at now (the poller's clock, for the horizon), and
// returns what it charges to each counter it carries, and how it relates to
// the previous sample of its activation: EventNotMeasured, EventEnded, or
// the CPU counter's event (EventCPUAbsent when s has none).
func (a *Accountant) Sample(s *sandboxstatsv1.WorkloadStatsSample, now time.Time) (Charges, Event) {
	if !Measured(s) {
		return nil, EventNotMeasured
	}
	key := KeyOf(s)
	if _, done := a.ended[key]; done {
		return nil, EventEnded
	}
	rs := readings(s, a.cfg.PerInterface)
	acc := a.live[key]
	if acc == nil {
		if len(rs) == 0 {
			return nil, EventCPUAbsent
		}
		acc = &account{counters: make(map[CounterID]*counterAccount)}
		a.live[key] = acc
	}
	acc.prevSeen, acc.lastSeen = acc.lastSeen, now
	fresh := !time.Unix(0, s.GetEpochUnixNano()).Before(a.cfg.Started)
	charges := make(Charges, 0, len(rs))
	var implausibleReset, grew, absurd bool
	for _, r := range rs {
		if r.v >= absurdValue {
			absurd = true
		}
		ch, ok := a.step(acc, s, r, fresh, &implausibleReset)
		if !ok {
			// Refused on its own: the other counters are judged on theirs.
			grew = true
			ch.Value, ch.Event = 0, EventImplausible
		}
		charges = append(charges, ch)
	}
	switch {
	case absurd:
		// No real counter reaches 2^62: the whole sample is untrustworthy.
		a.refused.add(RefusedAbsurd)
		for i := range charges {
			charges[i].Value = 0
		}
		return charges, EventImplausible
	case grew:
		a.refused.add(RefusedGrowth)
	}
	if c, ok := charges.Of(CounterID{Counter: CounterCPU}); ok {
		return charges, c.Event
	}
	return charges, EventCPUAbsent
}

// step charges one counter of a sample of acc's activation; fresh: the
// epoch began after the poller started. *implausibleReset is set when a
// bounded counter of the sample decreased to more than the time since the
// last sample allows (not a reset: another source's counters), and then
// the decreases of the sample's counters without a tight bound charge
// nothing. ok is false when the counter's charge is refused: it grew
// (body, or a reset's new value, or the head of a counter without a tight
// bound) more than its bound allows in the time; then the caller charges
// nothing of this counter, and the account continues from its value.
func (a *Accountant) step(acc *account, s *sandboxstatsv1.WorkloadStatsSample, r reading, fresh bool, implausibleReset *bool) (Charge, bool) {
	own, since, withBase, below := ownValue(s, r.id, r.v)
	if below {
		// The counter went below the baseline: the guest's counter was reset
		// within the epoch; its value is usage not yet charged.
		withBase, own = false, r.v
	}
	at := s.GetObservedAtUnixNano()
	ch := Charge{ID: r.id}
	ok := true
	c := acc.counters[r.id]
	if c == nil {
		c = &counterAccount{withBaseline: withBase}
		acc.counters[r.id] = c
		ch.Event = EventFirst
		if withBase && fresh {
			ch.Value, ok = a.head(acc, r.id.Counter, own, since, at)
		}
	} else {
		tight := counterSpecs[r.id.Counter].bound.tight()
		switch {
		case withBase != c.withBaseline:
			// The baseline appeared or changed mid-activation (statsd
			// restarted before persisting it): the values are not
			// comparable; take this one as the new starting point.
			c.withBaseline = withBase
			ch.Event = EventCounterReset
		case own >= c.last:
			ch.Value = own - c.last
			ok = a.grewPlausibly(acc, c, r.id.Counter, ch.Value, at)
		default:
			ch.Event = EventCounterReset
			switch {
			case !tight:
				// A reset of a counter with only a plausibility bound: its
				// new value is charged if it is plausible since the last
				// sample, unless a tight counter of the sample said the
				// decrease is another source's.
				if !*implausibleReset {
					ch.Value = own
					ok = a.grewPlausibly(acc, c, r.id.Counter, own, at)
				}
			case a.fits(r.id.Counter, own, c.lastObserved, at):
				ch.Value = own
			default:
				*implausibleReset = true
			}
		}
	}
	c.last, c.lastObserved = own, at
	return ch, ok
}

// head returns what the head (own usage from sinceUnixNano to atUnixNano)
// of counter c charges: all of it if it fits the time. A counter with a
// tight bound that does not fit shows a history (the activation's other
// counters are not charged from the epoch start either): nothing, ok. A
// counter with a plausibility bound is not charged when the activation
// has a history, and is refused (nothing, !ok) when it does not fit.
func (a *Accountant) head(acc *account, c Counter, own uint64, sinceUnixNano, atUnixNano int64) (uint64, bool) {
	fits := a.fits(c, own, sinceUnixNano-a.headSlack().Nanoseconds(), atUnixNano)
	switch {
	case !counterSpecs[c].bound.tight():
		switch {
		case acc.history:
			return 0, true
		case !fits:
			return 0, false
		}
		return own, true
	case !fits:
		acc.history = true
		return 0, true
	}
	return own, true
}

// grewPlausibly reports whether counter c of acc could have grown by v
// from its last sample to one observed at atUnixNano (by the daemon's
// clock; by the caller's, the last sample's now to this one's, when a
// sample lacks its observed time).
func (a *Accountant) grewPlausibly(acc *account, c *counterAccount, counter Counter, v uint64, atUnixNano int64) bool {
	since, at := c.lastObserved, atUnixNano
	if since == 0 || at == 0 {
		since, at = acc.prevSeen.UnixNano(), acc.lastSeen.UnixNano()
	}
	return a.fits(counter, v, since-bodySlack.Nanoseconds(), at)
}

func (a *Accountant) headSlack() time.Duration { return max(a.cfg.HeadSlack, 0) }

// fits reports whether counter c could have grown by v between
// sinceUnixNano and atUnixNano: CPU and stall time on CPUs processors
// (unbounded when CPUs is 0, as periods are), periods at one per
// millisecond, bytes at MaxBytesPerSecond and counts at
// MaxCountsPerSecond (whatever CPUs).
func (a *Accountant) fits(c Counter, v uint64, sinceUnixNano, atUnixNano int64) bool {
	b := counterSpecs[c].bound
	if v == 0 || (a.cfg.CPUs <= 0 && b.tight()) {
		return true
	}
	window := atUnixNano - sinceUnixNano
	if window <= 0 {
		return false
	}
	us := uint64(window) / 1000
	switch b {
	case boundPeriods:
		return v <= us/1000
	case boundBytes:
		return v <= perWindow(MaxBytesPerSecond, uint64(window))
	case boundCount:
		return v <= perWindow(MaxCountsPerSecond, uint64(window))
	}
	return v/uint64(a.cfg.CPUs) <= us
}

// perWindow returns perSecond x windowNanos / 1e9, the uint64 maximum
// where that is more.
func perWindow(perSecond, windowNanos uint64) uint64 {
	hi, lo := bits.Mul64(perSecond, windowNanos)
	if hi >= 1e9 {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, 1e9)
	return q
}

// Prune forgets the activations not seen, and the ended records not
// charged, within the horizon before now (the caller's clock), and returns
// the live ones forgotten.
func (a *Accountant) Prune(now time.Time) []ActivationKey {
	var gone []ActivationKey
	for k, acc := range a.live {
		if now.Sub(latest(acc.lastSeen, acc.restored)) > a.cfg.Horizon {
			delete(a.live, k)
			gone = append(gone, k)
		}
	}
	// Oldest first: a new slice when most of the array is gone, so the
	// keys forgotten are not held by it.
	keep := a.endedOrder[:0]
	for _, k := range a.endedOrder {
		if now.Sub(a.ended[k]) > a.cfg.Horizon {
			delete(a.ended, k)
			continue
		}
		keep = append(keep, k)
	}
	clear(a.endedOrder[len(keep):])
	a.endedOrder = keep
	if cap(a.endedOrder) > 2*len(a.endedOrder)+64 {
		a.endedOrder = append([]ActivationKey(nil), a.endedOrder...)
	}
	return gone
}

// Len returns the activations remembered, live and ended.
func (a *Accountant) Len() (live, ended int) { return len(a.live), len(a.ended) }

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

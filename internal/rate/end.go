package rate

import (
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// EndEvent says how an ended activation's CPU was charged.
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
	// EndImplausible: more CPU than the activation's time allows, or (a
	// refused record, see Refused) a tail grown more than the time since
	// the last sample allows or a counter at an absurd value: nothing of
	// the record is charged.
	EndImplausible EndEvent = "implausible"
)

// End charges an ended activation's tail once: its CPU (from the record's
// cpu_usec) and every other counter of its final sample, each by the rules
// of its samples; how says how the CPU was charged. first is false (and
// nothing charged) for a record already charged, one that ended before the
// poller started (a previous poller's) or longer ago than the horizon. A
// charged record is remembered for the horizon from now (the caller's
// clock: a daemon's end time never keeps it longer), at most MaxEnded of
// them.
func (a *Accountant) End(e *sandboxstatsv1.EndedActivation, now time.Time) (charges Charges, how EndEvent, first bool) {
	key := EndedKeyOf(e)
	end := time.Unix(0, e.GetEndUnixNano())
	if _, done := a.ended[key]; done || end.Before(a.cfg.Started) || now.Sub(end) > a.cfg.Horizon {
		return nil, "", false
	}
	a.remember(key, now)
	acc := a.live[key]
	delete(a.live, key)
	if acc == nil {
		acc = &account{counters: make(map[CounterID]*counterAccount)}
	}
	fresh := !time.Unix(0, e.GetEpochUnixNano()).Before(a.cfg.Started)
	cpu, how := a.endCPU(acc, e, fresh, now)
	if how != EndNoCPU {
		charges = append(charges, Charge{ID: CounterID{Counter: CounterCPU}, Value: cpu})
	}
	if how == EndImplausible {
		acc.history = true
	}
	final := e.GetFinal()
	at := final.GetObservedAtUnixNano()
	if at == 0 {
		at = e.GetEndUnixNano()
	}
	// Each counter's tail is judged on its own: a refused one charges
	// nothing and the others are charged; a counter at an absurd value
	// makes the whole record untrustworthy.
	grew := how == endRefused
	if grew {
		how = EndImplausible
	}
	absurd := e.GetCpuUsec() >= absurdValue
	for _, r := range readings(final, a.cfg.PerInterface) {
		if r.v >= absurdValue {
			absurd = true
		}
		if r.id.Counter != CounterCPU {
			v, ok := a.endCounter(acc, e, r, fresh, at, now)
			if !ok {
				grew, v = true, 0
			}
			charges = append(charges, Charge{ID: r.id, Value: v})
		}
	}
	switch {
	case absurd:
		a.refused.add(RefusedAbsurd)
		for i := range charges {
			charges[i].Value = 0
		}
		how = EndImplausible
	case grew:
		a.refused.add(RefusedGrowth)
	}
	return charges, how, true
}

// endRefused is endCPU's answer for a tail grown more than the time since
// the last sample allows (End reports it as EndImplausible, refused).
const endRefused EndEvent = "refused"

// remember records key as charged at now, forgetting the oldest charged
// (and counting it) past MaxEnded.
func (a *Accountant) remember(key ActivationKey, now time.Time) {
	for len(a.endedOrder) >= a.cfg.MaxEnded {
		delete(a.ended, a.endedOrder[0])
		a.endedOrder[0] = ActivationKey{}
		a.endedOrder = a.endedOrder[1:]
		a.refused.add(RefusedEndedEvicted)
	}
	a.ended[key] = now
	a.endedOrder = append(a.endedOrder, key)
}

// tail returns the growth of counter c of acc (its account ca) from the
// last sample to v, the value of e's final, and whether it is plausible:
// within the bound a body's growth has, to the later of the final's
// observed time and the end (by the caller's clock, the last sample's now
// to this one, when the last sample lacked its observed time).
func (a *Accountant) tail(acc *account, ca *counterAccount, c Counter, v uint64, e *sandboxstatsv1.EndedActivation, now time.Time) (uint64, bool) {
	if v < ca.last {
		return 0, true
	}
	since, at := ca.lastObserved, max(e.GetFinal().GetObservedAtUnixNano(), e.GetEndUnixNano())
	if since == 0 {
		since, at = acc.lastSeen.UnixNano(), now.UnixNano()
	}
	return v - ca.last, a.fits(c, v-ca.last, since-bodySlack.Nanoseconds(), at)
}

// endCPU charges the CPU tail of e, the record of acc's activation. A
// tail grown more than the time since the last sample allows is
// endRefused.
func (a *Accountant) endCPU(acc *account, e *sandboxstatsv1.EndedActivation, fresh bool, now time.Time) (uint64, EndEvent) {
	c := acc.counters[CounterID{Counter: CounterCPU}] // nil if the activation's CPU was never sampled
	final := e.GetFinal()
	var v uint64
	switch {
	case c != nil && !c.withBaseline && final != nil && final.CpuUsageUsec != nil:
		v = final.GetCpuUsageUsec()
	case e.CpuUsec == nil:
		return 0, EndNoCPU
	case c != nil:
		v = e.GetCpuUsec()
	}
	if c != nil {
		if d, ok := a.tail(acc, c, CounterCPU, v, e, now); ok {
			return d, EndTail
		}
		return 0, endRefused
	}
	if !fresh {
		return 0, EndUnseenOld
	}
	since := e.GetEpochUnixNano() + e.GetBaselineDelayNanos() - a.headSlack().Nanoseconds()
	if v := e.GetCpuUsec(); a.fits(CounterCPU, v, since, e.GetEndUnixNano()) {
		return v, EndWhole
	}
	return 0, EndImplausible
}

// endCounter charges the tail of one counter other than CPU from the final
// sample of e (observed at atUnixNano); false: a tail grown more than the
// time since the last sample allows, or (never sampled) a head past its
// plausibility bound.
func (a *Accountant) endCounter(acc *account, e *sandboxstatsv1.EndedActivation, r reading, fresh bool, atUnixNano int64, now time.Time) (uint64, bool) {
	final := e.GetFinal()
	own, since, withBase, below := ownValue(final, r.id, r.v)
	if below {
		withBase, own = false, r.v
	}
	if c := acc.counters[r.id]; c != nil {
		v := own
		if !c.withBaseline {
			v = r.v
		}
		return a.tail(acc, c, r.id.Counter, v, e, now)
	}
	if !fresh || !withBase {
		return 0, true // begun before the poller started, or nothing to count from
	}
	return a.head(acc, r.id.Counter, own, since, atUnixNano)
}

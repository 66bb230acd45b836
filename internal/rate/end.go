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
	// EndImplausible: more CPU than the activation's time allows.
	EndImplausible EndEvent = "implausible"
)

// End charges an ended activation's tail once: its CPU (from the record's
// cpu_usec) and every other counter of its final sample, each by the rules
// of its samples; how says how the CPU was charged. first is false (and
// nothing charged) for a record already charged, one that ended before the
// poller started (a previous poller's) or longer ago than the horizon.
func (a *Accountant) End(e *sandboxstatsv1.EndedActivation, now time.Time) (charges Charges, how EndEvent, first bool) {
	key := EndedKeyOf(e)
	end := time.Unix(0, e.GetEndUnixNano())
	if _, done := a.ended[key]; done || end.Before(a.cfg.Started) || now.Sub(end) > a.cfg.Horizon {
		return nil, "", false
	}
	a.ended[key] = end
	acc := a.live[key]
	delete(a.live, key)
	if acc == nil {
		acc = &account{counters: make(map[CounterID]*counterAccount)}
	}
	fresh := !time.Unix(0, e.GetEpochUnixNano()).Before(a.cfg.Started)
	cpu, how := a.endCPU(acc.counters[CounterID{Counter: CounterCPU}], e, fresh)
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
	for _, r := range readings(final, a.cfg.PerInterface) {
		if r.id.Counter != CounterCPU {
			charges = append(charges, Charge{ID: r.id, Value: a.endCounter(acc, final, r, fresh, at)})
		}
	}
	return charges, how, true
}

// endCPU charges the CPU tail of e; c is the CPU account (nil if the
// activation's CPU was never sampled).
func (a *Accountant) endCPU(c *counterAccount, e *sandboxstatsv1.EndedActivation, fresh bool) (uint64, EndEvent) {
	final := e.GetFinal()
	switch {
	case c != nil && !c.withBaseline && final != nil && final.CpuUsageUsec != nil:
		if raw := final.GetCpuUsageUsec(); raw >= c.last {
			return raw - c.last, EndTail
		}
		return 0, EndTail
	case e.CpuUsec == nil:
		return 0, EndNoCPU
	case c != nil:
		if own := e.GetCpuUsec(); own >= c.last {
			return own - c.last, EndTail
		}
		return 0, EndTail
	case !fresh:
		return 0, EndUnseenOld
	}
	since := e.GetEpochUnixNano() + e.GetBaselineDelayNanos() - a.headSlack().Nanoseconds()
	if v := e.GetCpuUsec(); a.fits(CounterCPU, v, since, e.GetEndUnixNano()) {
		return v, EndWhole
	}
	return 0, EndImplausible
}

// endCounter charges the tail of one counter other than CPU from the final
// sample (observed at atUnixNano).
func (a *Accountant) endCounter(acc *account, final *sandboxstatsv1.WorkloadStatsSample, r reading, fresh bool, atUnixNano int64) uint64 {
	own, since, withBase, below := ownValue(final, r.id, r.v)
	if below {
		withBase, own = false, r.v
	}
	if c := acc.counters[r.id]; c != nil {
		v := own
		if !c.withBaseline {
			v = r.v
		}
		if v >= c.last {
			return v - c.last
		}
		return 0
	}
	if !fresh || !withBase {
		return 0 // begun before the poller started, or nothing to count from
	}
	return a.head(acc, r.id.Counter, own, since, atUnixNano)
}

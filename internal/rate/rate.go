package rate

import (
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Event says how a sample relates to the previous measured sample of the
// same series. The empty Event means "continues it": a rate was computed.
type Event string

const (
	// EventNone: same actor, source and epoch, counter did not decrease,
	// time moved forward.
	EventNone Event = ""
	// EventFirst: the first measured sample seen; nothing to compare with.
	EventFirst Event = "first-sight"
	// EventNotMeasured: source UNSPECIFIED; the sample carries attribution
	// only. The previous measured sample stays the baseline.
	EventNotMeasured Event = "not-measured"
	// EventActorChanged: a different actor is now sampled.
	EventActorChanged Event = "actor-changed"
	// EventSourceChanged: the numbers now come from another source (layer);
	// they are not comparable with the previous ones.
	EventSourceChanged Event = "source-changed"
	// EventEpochReset: epoch_unix_nano changed (a Run or Restore).
	EventEpochReset Event = "epoch-reset"
	// EventCounterReset: cpu_usage_usec decreased within the same epoch.
	EventCounterReset Event = "counter-reset"
	// EventCPUAbsent: the sample is measured but carries no CPU counter (see
	// its absent list); memory still counts, no rate, and the previous
	// sample with a counter stays the baseline.
	EventCPUAbsent Event = "cpu-absent"
	// EventNoInterval: observed_at did not move forward (identical or
	// earlier timestamp); no rate can be computed.
	EventNoInterval Event = "no-interval"
)

// Measured reports whether s carries measurements (its source is not
// UNSPECIFIED).
func Measured(s *sandboxstatsv1.WorkloadStatsSample) bool {
	return s.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED
}

// classify says how cur relates to prev, the previous measured sample of the
// series (nil if none). It does not look at timestamps; see cpuCores.
func classify(prev, cur *sandboxstatsv1.WorkloadStatsSample) Event {
	switch {
	case !Measured(cur):
		return EventNotMeasured
	case cur.CpuUsageUsec == nil:
		return EventCPUAbsent
	case prev == nil:
		return EventFirst
	case prev.GetActorUid() != cur.GetActorUid():
		return EventActorChanged
	case prev.GetSource() != cur.GetSource():
		return EventSourceChanged
	case prev.GetEpochUnixNano() != cur.GetEpochUnixNano():
		return EventEpochReset
	case cur.GetCpuUsageUsec() < prev.GetCpuUsageUsec():
		return EventCounterReset
	}
	return EventNone
}

// cpuCores returns the CPU cores used between prev and cur: delta
// cpu_usage_usec over delta observed_at (wall time of the daemon). ok is
// false, with the reason, when the pair gives no rate (see classify;
// EventNoInterval when observed_at did not move forward).
func cpuCores(prev, cur *sandboxstatsv1.WorkloadStatsSample) (cores float64, ev Event, ok bool) {
	ev = classify(prev, cur)
	if ev != EventNone {
		return 0, ev, false
	}
	dt := cur.GetObservedAtUnixNano() - prev.GetObservedAtUnixNano()
	if dt <= 0 {
		return 0, EventNoInterval, false
	}
	dUsec := cur.GetCpuUsageUsec() - prev.GetCpuUsageUsec()
	return float64(dUsec) * 1e3 / float64(dt), EventNone, true
}

package rate

import (
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// WorkloadKey names one workload's CPU counter: its actor and the source
// the counter comes from (different sources are different counters).
type WorkloadKey struct {
	ActorUID string
	Source   sandboxstatsv1.StatsSource
}

// KeyOf returns the WorkloadKey of a sample.
func KeyOf(s *sandboxstatsv1.WorkloadStatsSample) WorkloadKey {
	return WorkloadKey{ActorUID: s.GetActorUid(), Source: s.GetSource()}
}

// CPUCounter turns per-epoch cpu_usage_usec counters into CPU time charged
// to a counter that never decreases. For each workload (WorkloadKey):
//
//   - first sight charges nothing: the workload may have run for hours
//     before this process started, or be its own restart, and charging its
//     whole counter would show as a spike in rate();
//   - same epoch and the counter grew: charge the difference;
//   - same epoch and the counter decreased: the counter restarted from zero
//     under us (a reset), so its whole value is usage not yet charged:
//     charge the new value in full (as the upstream poller does);
//   - a new epoch_unix_nano: for a source whose counter restarts at the
//     epoch start (the cgroup source: the sandbox cgroup is recreated by a
//     Run or Restore), the new value is exactly the new epoch's usage so far,
//     none of it charged: charge it in full. For a source that carries its
//     counter across a restore (the guest agent, per the API), the value
//     includes usage of earlier activations, possibly already charged, and
//     the API forbids comparing across epochs: charge nothing and take it as
//     the baseline. This under-counts at most the usage between the restore
//     and the first sample of the new epoch (one interval), where charging
//     in full could charge the guest's whole lifetime again;
//   - plausibility bound on "in full": a value is charged in full only if it
//     could have been used since the counter restarted, that is at most
//     cpus x the wall time since then (since epoch_unix_nano for an epoch
//     change, since the previous sample for a decrease). A larger value
//     cannot be a counter that restarted (a cgroup reused across epochs, a
//     re-resolved sentry cgroup with a long history): it becomes the
//     baseline and nothing is charged;
//   - a sample that was not measured (source UNSPECIFIED) charges nothing
//     and keeps the baseline, but counts as seen;
//   - a workload not seen for longer than the grace period is forgotten; if
//     it comes back, that is a first sight again.
//
// A CPUCounter is not safe for concurrent use.
type CPUCounter struct {
	grace     time.Duration
	cpus      int
	workloads map[WorkloadKey]*counterState
}

type counterState struct {
	last     *sandboxstatsv1.WorkloadStatsSample // last measured sample; nil if none yet
	lastSeen time.Time
}

// NewCPUCounter returns a CPUCounter that forgets a workload not seen for
// longer than grace (0: forgotten at the first Prune after it was missed).
// cpus is the most CPUs a workload can use at once (the node's CPU count),
// for the plausibility bound; 0 disables the bound.
func NewCPUCounter(grace time.Duration, cpus int) *CPUCounter {
	return &CPUCounter{grace: grace, cpus: cpus, workloads: make(map[WorkloadKey]*counterState)}
}

// Observe records sample s, seen at now (the poller's clock, used only for
// the grace period), and returns the CPU time it charges in microseconds
// and how it relates to the previous sample of the same workload.
func (c *CPUCounter) Observe(s *sandboxstatsv1.WorkloadStatsSample, now time.Time) (chargedUsec uint64, ev Event) {
	key := KeyOf(s)
	st := c.workloads[key]
	if st == nil {
		st = &counterState{}
		c.workloads[key] = st
	}
	st.lastSeen = now
	ev = Classify(st.last, s)
	switch ev {
	case EventNotMeasured, EventCPUAbsent:
		return 0, ev // the last sample with a counter stays the baseline
	case EventNone:
		chargedUsec = s.GetCpuUsageUsec() - st.last.GetCpuUsageUsec()
	case EventCounterReset:
		chargedUsec = c.inFull(s, st.last.GetObservedAtUnixNano())
	case EventEpochReset:
		if countsFromEpochStart(s.GetSource()) {
			chargedUsec = c.inFull(s, s.GetEpochUnixNano())
		}
	default:
		// EventFirst (and actor/source changes, which cannot happen
		// within one key): a baseline, nothing charged.
	}
	st.last = s
	return chargedUsec, ev
}

// inFull returns s's whole counter if it could have been used since
// sinceUnixNano, else 0 (see the plausibility bound above).
func (c *CPUCounter) inFull(s *sandboxstatsv1.WorkloadStatsSample, sinceUnixNano int64) uint64 {
	v := s.GetCpuUsageUsec()
	if c.cpus <= 0 {
		return v
	}
	window := s.GetObservedAtUnixNano() - sinceUnixNano
	if window <= 0 || v/uint64(c.cpus) > uint64(window)/1000 {
		return 0
	}
	return v
}

// countsFromEpochStart reports whether a source's cpu_usage_usec restarts
// at zero when an epoch starts (stats.proto, field cpu_usage_usec).
func countsFromEpochStart(s sandboxstatsv1.StatsSource) bool {
	return s == sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP
}

// Prune forgets the workloads last seen before now minus the grace period
// and returns their keys.
func (c *CPUCounter) Prune(now time.Time) []WorkloadKey {
	var gone []WorkloadKey
	for k, st := range c.workloads {
		if now.Sub(st.lastSeen) > c.grace {
			delete(c.workloads, k)
			gone = append(gone, k)
		}
	}
	return gone
}

// Len returns the number of workloads remembered.
func (c *CPUCounter) Len() int { return len(c.workloads) }

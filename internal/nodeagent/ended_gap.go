package nodeagent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// metricEndedLost counts the ended records dropped before this agent read
// them.
const metricEndedLost = "sandboxstats_agent_ended_records_lost_total"

func newEndedLostCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: metricEndedLost,
		Help: "Ended records a statsd dropped (--ended-retention, --ended-max) before this agent read them: a gap in its instance's sequences, each gap also a lost event over OTLP. What came before the agent's first sight of an instance is not counted (it cannot know it)."})
}

// endedMark is what the agent knows of one daemon's ended records: the
// statsd instance it last saw at the socket, and the highest sequence of
// that instance it has read. In memory: an agent restarted starts again
// from its first sight.
type endedMark struct {
	instance string
	highest  uint64
	lastSeen time.Time // the agent's clock: pruned after EndedHorizon
}

// watchEnded checks r's ended log against what the agent read of the
// daemon before, then notes the records r read. A gap (the lowest sequence
// held above the highest read + 1, within one instance) is counted and
// emitted as a lost event. The first sight of a socket, or of a new
// instance at it (a statsd whose state was wiped or set aside), is no gap:
// what the instance dropped before is not knowable here, so the agent
// starts from its lowest sequence held (a new instance is logged).
func (m *metrics) watchEnded(r sweep.DaemonResult, now time.Time) {
	mark, known := m.endedMarks[r.Socket]
	mark.lastSeen = now
	l := r.EndedLog
	if l.GetInstanceId() == "" || l.GetLowestSequence() > l.GetNextSequence() {
		// No log (a statsd older than it, no answer), or one that does
		// not hold together: nothing to tell from it.
		if known {
			m.endedMarks[r.Socket] = mark
		}
		return
	}
	lowest := l.GetLowestSequence()
	switch {
	case !known:
		m.logger.Debug("first sight of a statsd's ended records: any it dropped before cannot be known",
			"socket", r.Socket, "instance_id", cut(l.GetInstanceId()), "lowest_sequence", lowest, "next_sequence", l.GetNextSequence())
		mark = endedMark{instance: l.GetInstanceId(), highest: max(lowest, 1) - 1, lastSeen: now}
	case mark.instance != l.GetInstanceId():
		m.logger.Warn("a statsd's ended records are a new instance's (its state was wiped or set aside): what the previous instance recorded after the highest sequence read is unknowable, and not counted lost",
			"socket", r.Socket, "previous_instance_id", cut(mark.instance), "highest_sequence_read", mark.highest,
			"instance_id", cut(l.GetInstanceId()), "lowest_sequence", lowest)
		mark = endedMark{instance: l.GetInstanceId(), highest: max(lowest, 1) - 1, lastSeen: now}
	case lowest > mark.highest+1:
		from, to := mark.highest+1, lowest-1
		m.endedLost.Add(float64(to - from + 1))
		if m.otel != nil {
			m.otel.lostEvent(r.Socket, mark.instance, from, to, now)
		}
		m.logger.Warn("ended records dropped by statsd before this agent read them: their usage is lost",
			"socket", r.Socket, "instance_id", cut(mark.instance), "lost", to-from+1, "from_sequence", from, "to_sequence", to)
		mark.highest = to
	}
	for _, e := range r.Ended {
		if e.GetInstanceId() == mark.instance && e.GetSequence() < l.GetNextSequence() {
			mark.highest = max(mark.highest, e.GetSequence())
		}
	}
	m.endedMarks[r.Socket] = mark
}

// pruneEndedMarks forgets the daemons not seen for EndedHorizon.
func (m *metrics) pruneEndedMarks(now time.Time) {
	for s, mark := range m.endedMarks {
		if now.Sub(mark.lastSeen) > m.cfg.EndedHorizon {
			delete(m.endedMarks, s)
		}
	}
}

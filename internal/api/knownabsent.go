package api

import (
	"strconv"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The reasons of the KnownAbsent values, word for word as
// proto/sandboxstats/v1/stats.proto documents them: what a guest agent's
// StatsContainer never carries (every micro-VM sample), and network and
// block_io when no reply had entries.
const (
	WhyAgentNoHigh       = "StatsContainer carries no memory.high"
	WhyAgentNoOOM        = "StatsContainer carries no OOM kill count (failcnt counts limit hits, not kills; GetOOMEvent is the shim's)"
	WhyAgentNoEvents     = "StatsContainer carries no memory.events (failcnt counts v1 limit hits, not max events)"
	WhyAgentNoOOMControl = "StatsContainer carries no memory.oom_control"
	WhyAgentNoQuota      = "StatsContainer carries no CFS quota or period (cpu.max, cpu.cfs_*_us)"
	WhyAgentNoPressure   = "StatsContainer carries no pressure stall information"
	WhyAgentNoNetwork    = "the agent sent no network_stats (the Rust agent never fills them; its guest-wide GetMetrics is not read)"
	WhyAgentNoBlockIO    = "no reply has blkio_stats entries (a guest lists only devices with IO charged); 0 would claim no IO"
)

// knownAbsent is the AbsentValue each KnownAbsent value stands for, by
// number (each field once). StatsWorkloadRequest.known_absent covers
// values 1 to 11: a value added later needs a request field of its own
// (TestKnownAbsentTable holds the count).
var knownAbsent = [...]struct{ field, reason string }{
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_HIGH_BYTES:      {"memory_signals.high_bytes", WhyAgentNoHigh},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_OOM_KILLS:       {"memory_signals.oom_kills", WhyAgentNoOOM},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_OOM_GROUP_KILLS: {"memory_signals.oom_group_kills", WhyAgentNoEvents},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_OOM_EVENTS:      {"memory_signals.oom_events", WhyAgentNoEvents},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_MAX_EVENTS:      {"memory_signals.max_events", WhyAgentNoEvents},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_UNDER_OOM:       {"memory_signals.under_oom", WhyAgentNoOOMControl},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_QUOTA_USEC:      {"cpu_throttling.quota_usec", WhyAgentNoQuota},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_PERIOD_USEC:     {"cpu_throttling.period_usec", WhyAgentNoQuota},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_PRESSURE:        {"pressure", WhyAgentNoPressure},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_NETWORK:         {"network", WhyAgentNoNetwork},
	sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_BLOCK_IO:        {"block_io", WhyAgentNoBlockIO},
}

// knownAbsentByField is the code of each field in knownAbsent.
var knownAbsentByField = func() map[string]sandboxstatsv1.KnownAbsent {
	m := make(map[string]sandboxstatsv1.KnownAbsent, len(knownAbsent))
	for code, v := range knownAbsent {
		if v.field != "" {
			m[v.field] = sandboxstatsv1.KnownAbsent(code)
		}
	}
	return m
}()

// KnownAbsentCode is the code of the absent value field with reason
// (daemon side), or KNOWN_ABSENT_UNSPECIFIED when it has none: the reason
// must be the code's word for word.
func KnownAbsentCode(field, reason string) sandboxstatsv1.KnownAbsent {
	code, ok := knownAbsentByField[field]
	if !ok || knownAbsent[code].reason != reason {
		return sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_UNSPECIFIED
	}
	return code
}

// KnownAbsentValue is the absent value code stands for. A code this build
// does not know (from a newer statsd) is named by its number and said so:
// it is still a value the sample does not have.
func KnownAbsentValue(code sandboxstatsv1.KnownAbsent) *sandboxstatsv1.AbsentValue {
	v := new(sandboxstatsv1.AbsentValue)
	setKnownAbsent(v, code)
	return v
}

// setKnownAbsent sets v's field and reason to those code stands for (see
// KnownAbsentValue).
func setKnownAbsent(v *sandboxstatsv1.AbsentValue, code sandboxstatsv1.KnownAbsent) {
	if code > 0 && int(code) < len(knownAbsent) {
		v.Field, v.Reason = knownAbsent[code].field, knownAbsent[code].reason
		return
	}
	v.Field = "known_absent " + strconv.Itoa(int(code))
	v.Reason = "a KnownAbsent code this client does not know (statsd is newer): see proto/sandboxstats/v1/stats.proto"
}

// ExpandKnownAbsent turns s.known_absent into absent values (client side,
// for a client that shows reasons): after it, s.absent holds every absent
// value, as without known_absent in the request, and s.known_absent is
// empty. The codes' values come first.
func ExpandKnownAbsent(s *sandboxstatsv1.WorkloadStatsSample) {
	if s == nil || len(s.KnownAbsent) == 0 {
		return
	}
	// The messages in one block: a micro-VM sample names a dozen codes in
	// every answer.
	vals := make([]sandboxstatsv1.AbsentValue, len(s.KnownAbsent))
	all := make([]*sandboxstatsv1.AbsentValue, 0, len(s.KnownAbsent)+len(s.Absent))
	for i, code := range s.KnownAbsent {
		setKnownAbsent(&vals[i], code)
		all = append(all, &vals[i])
	}
	s.Absent, s.KnownAbsent = append(all, s.Absent...), nil
}

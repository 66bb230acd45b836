package server

import (
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The identity package numbers its outcome, provenance and baseline kinds as
// the wire does (TestActivationEnumsMatchTheWire holds it), so they convert
// by number.

func baselineToProto(b *identity.Baseline, id identity.Identity, class source.Class, epoch int64) *sandboxstatsv1.EpochBaseline {
	if b == nil {
		return nil
	}
	out := &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind(b.Kind), ObservedAtUnixNano: b.AtUnixNano}
	if b.FirstRead != nil {
		out.FirstRead = readingToSample(id, class, epoch, *b.FirstRead, b.AtUnixNano)
	}
	return out
}

// endedToProto converts an ended activation's record (nil for nil).
func endedToProto(e *identity.Ended) *sandboxstatsv1.EndedActivation {
	if e == nil {
		return nil
	}
	out := &sandboxstatsv1.EndedActivation{
		Identity:               identityToProto(e.Identity),
		SandboxClass:           classToProto(e.Class),
		EpochUnixNano:          e.EpochUnixNano,
		EndUnixNano:            e.EndUnixNano,
		Outcome:                sandboxstatsv1.ActivationOutcome(e.Outcome),
		FinalProvenance:        sandboxstatsv1.FinalProvenance(e.Provenance),
		FinalAgeNanos:          e.FinalAgeNanos,
		FinalReason:            e.FinalReason,
		CpuUsec:                e.CPUUsec,
		MemoryPeakBytes:        e.PeakBytes,
		MemoryPeakIsLowerBound: e.PeakIsLowerBound,
		BaselineDelayNanos:     e.BaselineDelayNanos,
		InstanceId:             e.InstanceID,
		Sequence:               e.Sequence,
	}
	if e.Final != nil {
		out.Source = kindToProto(e.Final.Kind)
		out.Final = readingToSample(e.Identity, e.Class, e.EpochUnixNano, *e.Final, e.FinalAtUnixNano)
		out.Final.EpochBaseline = baselineToProto(e.Baseline, e.Identity, e.Class, e.EpochUnixNano)
		capSample(out.Final)
	}
	for _, a := range e.Absent {
		out.Absent = append(out.Absent, &sandboxstatsv1.AbsentValue{Field: a.Field, Reason: a.Reason})
	}
	return out
}

// endedLogToProto converts the ended records' numbering; lowest is the
// lowest sequence the answer's state holds.
func endedLogToProto(l identity.EndedLog, lowest uint64) *sandboxstatsv1.EndedLog {
	return &sandboxstatsv1.EndedLog{
		InstanceId:         l.InstanceID,
		LowestSequence:     lowest,
		NextSequence:       l.NextSequence,
		EvictedRetention:   l.Evicted.ByRetention,
		EvictedMax:         l.Evicted.ByMax,
		EvictedSize:        l.Evicted.BySize,
		EvictedNeverServed: l.Evicted.NeverServed,
	}
}

// endedOutcomeName and finalProvenanceName name them for logs.
func endedOutcomeName(o identity.Outcome) string {
	return strings.ToLower(strings.TrimPrefix(sandboxstatsv1.ActivationOutcome(o).String(), "ACTIVATION_OUTCOME_"))
}

func finalProvenanceName(p identity.Provenance) string {
	return strings.ToLower(strings.TrimPrefix(sandboxstatsv1.FinalProvenance(p).String(), "FINAL_PROVENANCE_"))
}

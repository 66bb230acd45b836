package server

import (
	"context"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// WithDrift makes samples carry the number of open drift findings and serves
// ListDriftFindings from c. Without it the check reads as off.
func (s *StatsService) WithDrift(c *drift.Checker) *StatsService {
	s.drift = c
	return s
}

// WithDrift makes CheckpointWorkload ask c whether it had seen the sandbox
// dead before a call saying its runtime stopped it (runtime_stopped).
// Without it nothing was seen dead: such a stop always reads checkpointed.
func (l *LifecycleService) WithDrift(c *drift.Checker) *LifecycleService {
	l.drift = c
	return l
}

// ListDriftFindings lists the drift check's open findings and recent events.
func (s *StatsService) ListDriftFindings(context.Context, *sandboxstatsv1.ListDriftFindingsRequest) (*sandboxstatsv1.ListDriftFindingsResponse, error) {
	resp := &sandboxstatsv1.ListDriftFindingsResponse{Status: &sandboxstatsv1.DriftCheckStatus{}}
	if s.drift == nil {
		resp.Status.LastOutcome = "the drift check is off"
		return resp, nil
	}
	for _, f := range s.drift.Open() {
		resp.Findings = append(resp.Findings, findingToProto(f))
	}
	for _, e := range s.drift.Events() {
		resp.Events = append(resp.Events, &sandboxstatsv1.DriftEvent{
			AtUnixNano: e.At.UnixNano(), Type: sandboxstatsv1.DriftEventType(e.Type), Finding: findingToProto(e.Finding), Message: e.Message,
		})
	}
	st := s.drift.Status()
	resp.Status = &sandboxstatsv1.DriftCheckStatus{
		Enabled: st.Enabled, LastOutcome: st.Outcome, SkippedComparisons: st.Skipped,
	}
	if !st.LastCycle.IsZero() {
		resp.Status.LastCycleUnixNano = st.LastCycle.UnixNano()
	}
	if !st.Enabled {
		resp.Status.LastOutcome = "the drift check is off"
	}
	return resp, nil
}

// findingToProto converts a finding. drift numbers its kinds and event
// types as the wire does (TestDriftEnumsMatchTheWire holds it).
func findingToProto(f drift.Finding) *sandboxstatsv1.DriftFinding {
	return &sandboxstatsv1.DriftFinding{
		Kind: sandboxstatsv1.DriftKind(f.Kind), Subject: f.Subject, ActorUid: f.ActorUID, FirstSeenUnixNano: f.FirstSeen.UnixNano(), Detail: f.Detail,
	}
}

func (s *StatsService) openFindings(actorUID string) uint32 {
	if s.drift == nil {
		return 0
	}
	return s.drift.OpenCount(actorUID)
}

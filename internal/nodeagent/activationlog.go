package nodeagent

import (
	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ActivationRecord is one line of the activation log (--activation-log): a
// chargeback record of one ended activation, written once. Identity rides
// here, not on metric labels. A consumer dedupes by uid (the final event's
// log.record.uid): an agent killed after writing a line and before saving
// its state (--state-dir) writes it again after its restart.
type ActivationRecord struct {
	UID               string  `json:"uid"`
	ActorUID          string  `json:"actor_uid"`
	ActorName         string  `json:"actor_name,omitempty"`
	ActorNamespace    string  `json:"actor_namespace,omitempty"`
	TemplateNamespace string  `json:"template_namespace,omitempty"`
	TemplateName      string  `json:"template_name,omitempty"`
	SandboxClass      string  `json:"sandbox_class"`
	Source            string  `json:"source"`
	EpochUnixNano     int64   `json:"epoch_unix_nano"`
	EndUnixNano       int64   `json:"end_unix_nano"`
	DurationSeconds   float64 `json:"duration_seconds"`
	Outcome           string  `json:"outcome"`
	// FinalProvenance: read-at-end, last-good-poll (FinalAgeSeconds before
	// the end; usage after it is missing) or none.
	FinalProvenance string  `json:"final_provenance"`
	FinalAgeSeconds float64 `json:"final_age_seconds,omitempty"`
	FinalReason     string  `json:"final_reason,omitempty"`
	// CPUSeconds is the activation's own CPU (absent when unknown).
	CPUSeconds *float64 `json:"cpu_seconds,omitempty"`
	// ChargedSeconds is what this agent charged at the end (the tail, or the
	// whole activation if it never saw it); Charge says which.
	ChargedSeconds float64 `json:"charged_seconds"`
	Charge         string  `json:"charge"`
	// MemoryPeakBytes is the source's peak, or a lower bound.
	MemoryPeakBytes        *uint64 `json:"memory_peak_bytes,omitempty"`
	MemoryPeakIsLowerBound bool    `json:"memory_peak_is_lower_bound,omitempty"`
	// BaselineDelaySeconds: how long after the epoch start the baseline was
	// taken (guest agent); usage in that gap is not in CPUSeconds.
	BaselineDelaySeconds float64 `json:"baseline_delay_seconds,omitempty"`
	Socket               string  `json:"socket"`
}

func activationRecord(socket string, e *sandboxstatsv1.EndedActivation, chargedUsec uint64, how rate.EndEvent) ActivationRecord {
	id := e.GetIdentity()
	r := ActivationRecord{
		UID:      finalUID(e),
		ActorUID: id.GetActorUid(), ActorName: id.GetActorName(), ActorNamespace: id.GetActorNamespace(),
		TemplateNamespace: id.GetTemplateNamespace(), TemplateName: id.GetTemplateName(),
		SandboxClass: api.ClassName(e.GetSandboxClass()), Source: api.SourceName(e.GetSource()),
		EpochUnixNano: e.GetEpochUnixNano(), EndUnixNano: e.GetEndUnixNano(),
		DurationSeconds: float64(e.GetEndUnixNano()-e.GetEpochUnixNano()) / 1e9,
		Outcome:         api.OutcomeName(e.GetOutcome()), FinalProvenance: api.ProvenanceName(e.GetFinalProvenance()),
		FinalAgeSeconds: float64(e.GetFinalAgeNanos()) / 1e9, FinalReason: e.GetFinalReason(),
		ChargedSeconds: float64(chargedUsec) / 1e6, Charge: string(how),
		MemoryPeakBytes: e.MemoryPeakBytes, MemoryPeakIsLowerBound: e.GetMemoryPeakIsLowerBound(),
		BaselineDelaySeconds: float64(e.GetBaselineDelayNanos()) / 1e9,
		Socket:               socket,
	}
	if e.CpuUsec != nil {
		v := float64(e.GetCpuUsec()) / 1e6
		r.CPUSeconds = &v
	}
	return r
}

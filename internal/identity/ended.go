package identity

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Outcome is how an activation ended (numbered like the API's
// ActivationOutcome).
type Outcome int

const (
	OutcomeUnspecified Outcome = iota
	// OutcomeCheckpointed: ended by a Checkpoint with the sandbox running,
	// or dead after its runtime stopped it as asked
	// (ReleaseOptions.RuntimeStopped) and not seen dead before.
	OutcomeCheckpointed
	// OutcomeSandboxDead: at the end the sandbox had no process, or was gone
	// (with RuntimeStopped: and statsd had seen it dead before the call).
	OutcomeSandboxDead
	// OutcomeOOMKilled: dead, and the OOM kill count rose in the epoch.
	OutcomeOOMKilled
	// OutcomeReplaced: a Run/Restore of the same actor began a new epoch.
	OutcomeReplaced
)

// Provenance says how an ended activation's final reading was obtained
// (numbered like the API's FinalProvenance).
type Provenance int

const (
	ProvenanceUnspecified Provenance = iota
	// ProvenanceReadAtEnd: read by the lifecycle call that ended it.
	ProvenanceReadAtEnd
	// ProvenanceLastGoodPoll: that read failed; the final is the last good
	// reading of the epoch.
	ProvenanceLastGoodPoll
	// ProvenanceNone: that read failed and no read of the epoch succeeded.
	ProvenanceNone
)

// Ended is the record of one activation that ended: what the node agent
// needs to account its tail, and a chargeback record.
type Ended struct {
	Identity      Identity     `json:"identity"`
	Class         source.Class `json:"class"`
	EpochUnixNano int64        `json:"epoch_unix_nano"`
	EndUnixNano   int64        `json:"end_unix_nano"`
	Outcome       Outcome      `json:"outcome"`
	Provenance    Provenance   `json:"provenance"`
	// FinalAgeNanos: how long before the end Final was observed.
	FinalAgeNanos int64 `json:"final_age_nanos"`
	// FinalReason: why the read at the end failed.
	FinalReason string `json:"final_reason,omitempty"`
	// Final is the final reading (nil with ProvenanceNone), observed at
	// FinalAtUnixNano.
	Final           *source.Reading `json:"final,omitempty"`
	FinalAtUnixNano int64           `json:"final_at_unix_nano,omitempty"`
	Baseline        *Baseline       `json:"baseline,omitempty"`
	// CPUUsec is the activation's own CPU: Final's counter minus the
	// baseline's; nil (see Absent) when either is missing.
	CPUUsec *uint64 `json:"cpu_usec,omitempty"`
	// PeakBytes is the source's peak, or the highest current seen
	// (PeakIsLowerBound).
	PeakBytes        *uint64 `json:"peak_bytes,omitempty"`
	PeakIsLowerBound bool    `json:"peak_is_lower_bound,omitempty"`
	// BaselineDelayNanos: how long after the epoch start the baseline was
	// taken.
	BaselineDelayNanos int64           `json:"baseline_delay_nanos,omitempty"`
	Absent             []source.Absent `json:"absent,omitempty"`
	// InstanceID and Sequence name the record among its statsd instance's
	// (ledger.go), given when it is saved: the instance's id (ended.json
	// holds it once, not per record) and its place, from 1, never reused.
	InstanceID string `json:"-"`
	Sequence   uint64 `json:"sequence,omitempty"`

	// served is whether a reader was served it (ledger.go; persisted as
	// "served"). The one field that changes once published.
	served atomic.Uint32
}

// maxFinalReasonBytes bounds FinalReason: a source's error may quote what
// a guest said, and up to EndedMax records travel in every discovery
// answer.
const maxFinalReasonBytes = 1 << 10

// key names an activation: an actor's epoch.
func (e *Ended) key() string { return fmt.Sprintf("%s\x00%d", e.Identity.ActorUID, e.EpochUnixNano) }

// endActivation takes the final reading of b (bounded by timeout; a read in
// flight is joined by the source's own sharing, never waited on longer) and
// builds its record. With OutcomeCheckpointed the reading decides the
// outcome (deathOf; stopped: the runtime stopped the sandbox as asked, so a
// dead one is its expected end). It reads; it never writes.
func endActivation(ctx context.Context, b *Binding, outcome Outcome, stopped bool, now func() time.Time, timeout time.Duration) *Ended {
	e := &Ended{Identity: b.Identity, Class: b.Ref.Class, EpochUnixNano: b.EpochUnixNano, Outcome: outcome}
	observed := now().UnixNano()
	var (
		r   source.Reading
		err = fmt.Errorf("no source could be opened: %w", source.ErrNotMeasurable)
	)
	if b.Source != nil {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		r, err = b.Source.Sample(rctx)
		cancel()
	}
	e.EndUnixNano = now().UnixNano()
	last, maxCurrent, seen := b.Activation.snapshot()
	switch {
	case err == nil:
		r = b.Activation.ObserveEnd(r, observed)
		e.Provenance, e.Final, e.FinalAtUnixNano = ProvenanceReadAtEnd, &r, observed
		if r.MemoryCurrentBytes > maxCurrent || !seen {
			maxCurrent, seen = r.MemoryCurrentBytes, true
		}
	case last != nil:
		e.Provenance, e.FinalReason = ProvenanceLastGoodPoll, foreign.Bound(err.Error(), maxFinalReasonBytes)
		fr := last.Reading
		e.Final, e.FinalAtUnixNano = &fr, last.AtUnixNano
		e.FinalAgeNanos = max(e.EndUnixNano-last.AtUnixNano, 0)
	default:
		e.Provenance, e.FinalReason = ProvenanceNone, foreign.Bound(err.Error(), maxFinalReasonBytes)
	}
	e.Baseline = b.Activation.Baseline()
	if e.Baseline != nil && e.Baseline.Kind == BaselineFirstRead {
		e.BaselineDelayNanos = max(e.Baseline.AtUnixNano-e.EpochUnixNano, 0)
	}
	e.account(maxCurrent, seen)
	if outcome == OutcomeCheckpointed {
		e.Outcome = deathOf(e, err, stopped)
	}
	return e
}

// account fills the activation's own CPU and peak from the final reading.
func (e *Ended) account(maxCurrent uint64, seen bool) {
	if e.Final == nil {
		e.Absent = append(e.Absent, source.Absent{Field: "cpu_usec", Reason: "no reading of the activation succeeded"},
			source.Absent{Field: "memory_peak_bytes", Reason: "no reading of the activation succeeded"})
		return
	}
	base, okBase := e.Baseline.CPUUsec()
	switch {
	case e.Final.CPUUsageUsec == nil:
		e.Absent = append(e.Absent, source.Absent{Field: "cpu_usec", Reason: "the final reading has no CPU counter"})
	case !okBase:
		e.Absent = append(e.Absent, source.Absent{Field: "cpu_usec", Reason: "the epoch's baseline was never taken (no whole read of the epoch, every container with its CPU counter, succeeded)"})
	case *e.Final.CPUUsageUsec < base:
		e.Absent = append(e.Absent, source.Absent{Field: "cpu_usec", Reason: fmt.Sprintf(
			"the final counter %d is below the baseline %d: the counter was reset during the activation", *e.Final.CPUUsageUsec, base)})
	default:
		v := *e.Final.CPUUsageUsec - base
		e.CPUUsec = &v
	}
	switch {
	case e.Final.MemoryPeakBytes != nil:
		v := *e.Final.MemoryPeakBytes
		e.PeakBytes = &v
	case seen:
		v := maxCurrent
		e.PeakBytes, e.PeakIsLowerBound = &v, true
	}
}

// deathOf tells a checkpoint of a dead sandbox from one of a live one: no
// process left, the sandbox gone or its sentry exited is dead, and dead with
// the OOM kill count above the epoch's baseline is OOM-killed. A sandbox its
// runtime stopped as asked (stopped) is expected dead: checkpointed, unless
// OOM-killed (the OOM killer ended it, stop or not).
func deathOf(e *Ended, readErr error, stopped bool) Outcome {
	dead := errors.Is(readErr, source.ErrSandboxGone) ||
		(e.Final != nil && e.Final.SentryExited) ||
		(e.Final != nil && e.Final.NoProcessLeft())
	if !dead {
		return OutcomeCheckpointed
	}
	if k, ok := oomKills(e.Final); ok {
		base, okBase := uint64(0), e.Baseline != nil && e.Baseline.Kind == BaselineEpochStart
		if e.Baseline != nil && e.Baseline.Kind == BaselineFirstRead {
			base, okBase = oomKills(e.Baseline.FirstRead)
		}
		if okBase && k > base {
			return OutcomeOOMKilled
		}
	}
	if stopped {
		return OutcomeCheckpointed
	}
	return OutcomeSandboxDead
}

func oomKills(r *source.Reading) (uint64, bool) {
	if r == nil || r.Memory == nil || r.Memory.OOMKills == nil {
		return 0, false
	}
	return *r.Memory.OOMKills, true
}

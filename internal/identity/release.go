// This file is Release (Checkpoint) and the lists of bindings and cleared
// actors it updates.

package identity

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// ReleaseOptions qualify a Release.
type ReleaseOptions struct {
	// RuntimeStopped: the caller says the sandbox's runtime stopped it on
	// request before the call (NRI relays StopPodSandbox only after the
	// sandbox's processes exited). A final reading that finds it dead is
	// then its expected end, OutcomeCheckpointed, unless its OOM kill count
	// rose over the epoch's baseline (OutcomeOOMKilled) or SeenDead says
	// statsd had seen it dead before the call arrived (OutcomeSandboxDead).
	RuntimeStopped bool
	// SeenDead reports whether statsd had seen the sandbox of actorUID's
	// activation (its epoch) dead by the time given (the call's arrival);
	// nil: never. It is asked only with RuntimeStopped, with the actor's
	// lifecycle lock held, before the final read: it must not read or wait,
	// only ask what statsd already knows (the drift check's findings).
	SeenDead func(actorUID string, epoch int64, by time.Time) bool
}

// Release ends actorUID's activation (Checkpoint) with no options: see
// ReleaseWith.
func (s *Store) Release(ctx context.Context, actorUID string) (*Ended, error) {
	return s.ReleaseWith(ctx, actorUID, ReleaseOptions{})
}

// ReleaseWith ends actorUID's activation (Checkpoint): it takes one last
// bounded reading, records the ended activation, and forgets the workload;
// the other bindings are untouched. Releasing an actor that was released and
// not bound since succeeds again and returns the same record (nil once it is
// past the retention), whatever the options, so a retry is safe; any other
// actor not bound is ErrActorMismatch, or ErrNoWorkload when nothing at all
// is bound.
func (s *Store) ReleaseWith(ctx context.Context, actorUID string, opt ReleaseOptions) (*Ended, error) {
	if err := ValidateActorUID(actorUID); err != nil {
		return nil, err
	}
	arrived := s.cfg.Now()
	defer s.lockActor(actorUID)()
	old := s.Bound(actorUID)
	if old == nil {
		s.commit.Lock()
		retry := slices.Contains(s.cleared, actorUID)
		n := len(s.view.Load().bindings)
		s.commit.Unlock()
		switch {
		case retry:
			return s.lastEndedOf(actorUID), nil
		case n == 0:
			return nil, fmt.Errorf("%w: nothing to checkpoint for actor %q", ErrNoWorkload, actorUID)
		default:
			return nil, fmt.Errorf("%w: actor %q is not among the %d workloads bound here", ErrActorMismatch, actorUID, n)
		}
	}
	// Asked before the final read: what statsd knew when the call came,
	// not what it learns while it ends the activation.
	stopped := opt.RuntimeStopped && (opt.SeenDead == nil || !opt.SeenDead(actorUID, old.EpochUnixNano, arrived))
	e := endActivation(ctx, old, OutcomeCheckpointed, stopped, s.cfg.Now, s.cfg.ReadTimeout)

	s.commit.Lock()
	defer s.commit.Unlock()
	ended, err := s.saveEnded(e)
	if err != nil {
		return nil, err
	}
	others := without(s.view.Load().bindings, actorUID)
	cleared := addCleared(s.cleared, actorUID, s.cfg.EndedMax)
	if err := s.saveBindings(others, cleared); err != nil {
		// The end is recorded, so a restart clears the binding: do it now.
		s.logger.Warn("checkpoint: the end is recorded but the cleared binding was not saved; a restart clears it", "actor_uid", actorUID, "err", err)
	}
	s.publish(others, ended) // the record and the forgetting, seen together
	s.cleared = cleared
	closeBinding(old, s.logger)
	return e, nil
}

// without returns a new list of bindings less actorUID's.
func without(bindings []*Binding, actorUID string) []*Binding {
	out := make([]*Binding, 0, len(bindings)+1)
	for _, b := range bindings {
		if b.Identity.ActorUID != actorUID {
			out = append(out, b)
		}
	}
	return out
}

// addCleared returns cleared with actorUID last, at most max long (the
// oldest dropped). It never modifies cleared.
func addCleared(cleared []string, actorUID string, max int) []string {
	out := append(removeCleared(cleared, actorUID), actorUID)
	if over := len(out) - max; over > 0 {
		out = out[over:]
	}
	return out
}

// removeCleared returns cleared less actorUID. It never modifies cleared.
func removeCleared(cleared []string, actorUID string) []string {
	out := make([]string, 0, len(cleared)+1)
	for _, a := range cleared {
		if a != actorUID {
			out = append(out, a)
		}
	}
	return out
}

// This file is Bind (Run and Restore) and the opening of a binding's
// sources.

package identity

import (
	"context"
	"fmt"
	"slices"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// sentryPinner is a source that pinned a process by its start time (the
// gVisor source bound by sentry pid).
type sentryPinner interface {
	SentryStartTicks() (ticks uint64, ok bool)
}

// pinnedStart is the start time src pinned its sentry by, or 0.
func pinnedStart(src source.Source) uint64 {
	if p, ok := src.(sentryPinner); ok {
		if ticks, ok := p.SentryStartTicks(); ok {
			return ticks
		}
	}
	return 0
}

func (s *Store) openSources(ref source.SandboxRef) (source.Source, source.HostSampler) {
	src, host, err := s.cfg.Open(ref)
	if err != nil {
		// Bound but not measurable: the identity still holds, so a workload
		// that cannot be measured is still attributed.
		s.logger.Warn("could not open measurement source", "class", ref.Class, "err", err)
	}
	return src, host
}

// Bind binds a workload (Run or Restore). The same call repeated (same op,
// identity and ref) is a retry: it changes nothing and returns the current
// binding. Binding a bound actor anew (another op or ref) ends its
// activation (replaced, returned) and starts a new epoch. An actor not bound
// is added beside the others, unless that passes the ceiling
// (ErrTooManyWorkloads); a sandbox another actor's binding names is refused
// (ErrOtherWorkload). The state is persisted before the binding is
// published. Calls for other actors run at once; only their commits are
// serialized.
func (s *Store) Bind(ctx context.Context, op Op, id Identity, ref source.SandboxRef) (*Binding, *Ended, error) {
	if op != OpRun && op != OpRestore {
		return nil, nil, fmt.Errorf("%w: unknown op %q", ErrInvalid, op)
	}
	if err := id.Validate(); err != nil {
		return nil, nil, err
	}
	if err := ValidateRef(ref); err != nil {
		return nil, nil, err
	}
	defer s.lockActor(id.ActorUID)()
	old := s.Bound(id.ActorUID)
	if old != nil && old.Op == op && old.Identity == id && old.Ref.Equal(ref) {
		// A retry; with another container set, it updates the set.
		if err := s.updateSet(old, ref.ContainerSet()); err != nil {
			return nil, nil, err
		}
		return old, nil, nil
	}
	// What the ref's names and the others' unsettled ones lead to now, looked
	// at under the actor's lock only, within the read timeout in all.
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	mine := resolveRef(rctx, s.g, ref)
	s.refreshNames(rctx, s.view.Load(), id.ActorUID)
	cancel()
	if err := s.admit(s.view.Load(), id.ActorUID, ref, nil, mine); err != nil {
		return nil, nil, err
	}
	var replaced *Ended
	if old != nil {
		replaced = endActivation(ctx, old, OutcomeReplaced, false, s.cfg.Now, s.cfg.ReadTimeout)
	}
	// The new epoch begins once the replaced activation has ended (its
	// final read done), so the two never overlap.
	epoch := s.cfg.Now().UnixNano()
	if replaced != nil && epoch < replaced.EndUnixNano {
		epoch = replaced.EndUnixNano
	}
	if old != nil && epoch <= old.EpochUnixNano {
		epoch = old.EpochUnixNano + 1 // epochs only move forward
	}
	b := &Binding{Identity: id, Ref: ref, Op: op, EpochUnixNano: epoch, Activation: newActivation(ref, epoch, nil), names: newNames(ref, mine), breakdown: &breakdownHolder{}}
	b.Activation.exitedChanged = s.persistSoon
	b.Activation.sampled = s.breakdownSoon
	b.Source, b.Host = s.openSources(ref)
	s.guard(b) // names that did not resolve yet are looked at again at its reads
	b.Ref.SentryStartTicks = pinnedStart(b.Source)

	s.commit.Lock()
	defer s.commit.Unlock()
	v := s.view.Load()
	// Another actor's call may have committed while the sources opened.
	if err := s.admit(v, id.ActorUID, ref, b.Source, mine); err != nil {
		closeBinding(b, s.logger)
		return nil, nil, err
	}
	ended := v.ended
	if replaced != nil {
		var err error
		if ended, err = s.saveEnded(replaced); err != nil {
			closeBinding(b, s.logger)
			return nil, nil, err
		}
	}
	others := without(v.bindings, id.ActorUID)
	cleared := removeCleared(s.cleared, id.ActorUID)
	if err := s.saveBindings(append(slices.Clone(others), b), cleared); err != nil {
		closeBinding(b, s.logger)
		if replaced != nil {
			// The old activation's end is recorded: forget it too, so memory
			// matches what a restart would find (NewStore clears a binding
			// whose end is recorded).
			s.publish(others, ended)
			s.cleared = addCleared(s.cleared, id.ActorUID, s.cfg.EndedMax)
			closeBinding(old, s.logger)
		}
		return nil, replaced, err
	}
	s.publish(append(others, b), ended)
	s.cleared = cleared
	if old != nil {
		closeBinding(old, s.logger)
	}
	s.startBaseline(b)
	return b, replaced, nil
}

// This file is UpdateContainers (UpdateWorkloadContainers) and the writer
// that persists the exited containers reads find.

package identity

import (
	"context"
	"fmt"
	"slices"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// namedSet is an actor's container set about to apply.
type namedSet struct {
	actorUID string
	set      []source.ContainerRef
}

// UpdateContainers replaces actorUID's container set without a new
// activation: the epoch, the activation and the sources stay. The set must
// validate for the bound class (ValidateContainers). Where the source reads
// the set (a micro-VM's guest agent) it reads the new one from its next
// sample on, and a container that left it exits (its last figures kept);
// a gVisor set only names containers. The set is persisted before it
// applies (ErrNotPersisted: nothing changed). An actor not bound is
// ErrActorMismatch, or ErrNoWorkload when nothing is bound. Serialized
// with the actor's other lifecycle calls.
func (s *Store) UpdateContainers(_ context.Context, actorUID string, set []source.ContainerRef) (*Binding, error) {
	if err := ValidateActorUID(actorUID); err != nil {
		return nil, err
	}
	defer s.lockActor(actorUID)()
	b := s.Bound(actorUID)
	if b == nil {
		if n := len(s.Bindings()); n > 0 {
			return nil, fmt.Errorf("%w: actor %q is not among the %d workloads bound here", ErrActorMismatch, actorUID, n)
		}
		return nil, fmt.Errorf("%w: no containers to update for actor %q", ErrNoWorkload, actorUID)
	}
	if err := ValidateContainers(b.Ref.Class, set); err != nil {
		return nil, err
	}
	if err := s.updateSet(b, set); err != nil {
		return nil, err
	}
	return b, nil
}

// updateSet makes set b's container set: persisted first, then given to
// the activation and the source. The same set again changes nothing.
// Called with b's actor lock held.
func (s *Store) updateSet(b *Binding, set []source.ContainerRef) error {
	if slices.Equal(b.Activation.Containers(), set) {
		return nil
	}
	s.commit.Lock()
	defer s.commit.Unlock()
	if !s.IsBound(b) {
		return fmt.Errorf("%w: actor %q", ErrActorMismatch, b.Identity.ActorUID)
	}
	if err := s.saveBindingsWith(s.view.Load().bindings, s.cleared, &namedSet{actorUID: b.Identity.ActorUID, set: set}); err != nil {
		return err
	}
	if b.Activation.SetContainers(set) {
		s.persistSoon()
	}
	if setter, ok := b.Source.(source.ContainerSetter); ok {
		setter.SetContainers(set)
	}
	s.logger.Info("container set updated", "actor_uid", b.Identity.ActorUID, "epoch_unix_nano", b.EpochUnixNano, "containers", len(set))
	return nil
}

// persistSoon asks persistExited to write the state file. It never blocks.
func (s *Store) persistSoon() {
	select {
	case s.persistWake <- struct{}{}:
	default:
	}
}

// persistExited writes binding.json whenever an activation's exited
// containers changed (a read found one gone), so a restarted statsd keeps
// them; wakes arriving during a write are one more write. Reads never wait
// for it. It ends with the store.
func (s *Store) persistExited() {
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-s.persistWake:
		}
		s.commit.Lock()
		err := s.saveBindings(s.view.Load().bindings, s.cleared)
		s.commit.Unlock()
		if err != nil {
			s.logger.Warn("could not persist the exited containers; a restart may lose them", "err", err)
		}
	}
}

// flushExited writes binding.json once if persistExited was woken and did
// not write since: at Close, after it stopped (it may stop with a wake
// pending).
func (s *Store) flushExited() {
	select {
	case <-s.persistWake:
	default:
		return
	}
	s.commit.Lock()
	err := s.saveBindings(s.view.Load().bindings, s.cleared)
	s.commit.Unlock()
	if err != nil {
		s.logger.Warn("could not persist the exited containers at close; a restart may lose them", "err", err)
	}
}

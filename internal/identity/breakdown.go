// This file persists a source's derived state (source.Persistent: the
// gVisor breakdown's split) with its binding in binding.json, so that a
// restarted statsd continues it: saved when it changed and at least
// BreakdownSaveInterval passed, in the background, and at Close; given back
// to the source of a restored binding before its first read.

package identity

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// DefaultBreakdownSaveInterval is how often, at most, binding.json is
// rewritten for a changed source state alone.
const DefaultBreakdownSaveInterval = 10 * time.Second

// breakdownHolder is a binding's persisted source state: the one restored
// (persisted again while the source has none of its own) and the one the
// last binding.json write holds. Safe for concurrent use.
type breakdownHolder struct {
	mu       sync.Mutex
	restored []byte
	saved    []byte
}

// persistent is b's source as a source.Persistent, or nil.
func persistent(b *Binding) source.Persistent {
	if p, ok := b.Source.(source.Persistent); ok {
		return p
	}
	return nil
}

// breakdownNow is the state to persist for b now: the source's, else the
// one restored (nil: none). A state over the cap is not persisted.
func (s *Store) breakdownNow(b *Binding) []byte {
	var state []byte
	if p := persistent(b); p != nil {
		st, err := p.BreakdownState()
		if err != nil {
			s.logger.Warn("source state not persisted", "actor_uid", b.Identity.ActorUID, "err", err)
		}
		state = st
	}
	if b.breakdown == nil {
		return state
	}
	b.breakdown.mu.Lock()
	defer b.breakdown.mu.Unlock()
	if state == nil {
		state = b.breakdown.restored
	}
	if len(state) > source.MaxBreakdownStateBytes || !json.Valid(state) {
		return nil
	}
	return state
}

// markSaved records what a binding.json write holds for b.
func (b *Binding) markSaved(state []byte) {
	if b.breakdown == nil {
		return
	}
	b.breakdown.mu.Lock()
	b.breakdown.saved = state
	b.breakdown.mu.Unlock()
}

// breakdownChanged reports whether any binding's source state differs from
// the one binding.json holds.
func (s *Store) breakdownChanged() bool {
	for _, b := range s.Bindings() {
		if persistent(b) == nil || b.breakdown == nil {
			continue
		}
		now := s.breakdownNow(b)
		b.breakdown.mu.Lock()
		same := bytes.Equal(now, b.breakdown.saved)
		b.breakdown.mu.Unlock()
		if !same {
			return true
		}
	}
	return false
}

// newBreakdownHolder holds a restored binding's persisted state (nil: a
// new binding). One over the cap is dropped.
func (s *Store) newBreakdownHolder(actorUID string, state json.RawMessage) *breakdownHolder {
	if len(state) > source.MaxBreakdownStateBytes {
		s.logger.Warn("persisted source state over its cap: dropped", "actor_uid", actorUID, "bytes", len(state), "cap", source.MaxBreakdownStateBytes)
		state = nil
	}
	if len(state) > 0 {
		// As the source gave it (binding.json indents it).
		var c bytes.Buffer
		if json.Compact(&c, state) == nil {
			state = c.Bytes()
		}
	}
	return &breakdownHolder{restored: state, saved: state}
}

// restoreBreakdown gives a restored binding's persisted state to its
// source (before its first read). One the source refuses is dropped.
func (s *Store) restoreBreakdown(b *Binding) {
	b.breakdown.mu.Lock()
	state := b.breakdown.restored
	b.breakdown.mu.Unlock()
	p := persistent(b)
	if len(state) == 0 || p == nil {
		return
	}
	if err := p.RestoreBreakdownState(state); err != nil {
		s.logger.Warn("persisted source state refused: the source starts afresh", "actor_uid", b.Identity.ActorUID, "err", err)
		b.breakdown.mu.Lock()
		b.breakdown.restored = nil
		b.breakdown.mu.Unlock()
	}
}

// saveBreakdownIfChanged writes binding.json when a source state changed.
func (s *Store) saveBreakdownIfChanged() {
	if s.cfg.StateDir == "" || !s.breakdownChanged() {
		return
	}
	s.commit.Lock()
	err := s.saveBindings(s.view.Load().bindings, s.cleared)
	s.commit.Unlock()
	if err != nil {
		s.logger.Warn("could not persist the sources' state; a restart continues from an older one", "err", err)
	}
}

// breakdownSoon arms, when none is, a save of the changed source states
// BreakdownSaveInterval from now (Close saves once more): a sample may
// have changed one. Armed by samples only, so an idle statsd is never
// woken. It never blocks (Activation.sampled).
func (s *Store) breakdownSoon() {
	if s.cfg.StateDir == "" || !s.bdArmed.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(s.cfg.BreakdownSaveInterval, func() {
		s.bdArmed.Store(false)
		if s.bgCtx.Err() == nil {
			s.saveBreakdownIfChanged()
		}
	})
}

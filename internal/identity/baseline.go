// This file takes the epoch baseline of an activation whose counters
// survive a restore (a guest agent's), in the background, and persists it.

package identity

import (
	"context"
	"time"
)

// startBaseline takes the baseline of an activation whose counters survive
// a restore as soon as the source answers whole: it reads right away and
// retries promptly (100 ms, doubling to 2 s) while the binding is current
// and no whole reading came (from it or from a poll), then persists the
// baseline, so a restarted statsd keeps it.
func (s *Store) startBaseline(b *Binding) {
	if b.Activation.Baseline() != nil || b.Source == nil {
		return
	}
	s.bg.Go(func() {
		pause := s.cfg.BaselineRetry
		// A source that never answers whole (a guest agent that offers no
		// CPU counter) is not read every 2 s for the whole activation: the
		// taker gives up after maxBaselineTries, and a poll's whole reading
		// still becomes the baseline.
		for try := 0; try < maxBaselineTries && s.IsBound(b) && b.Activation.Baseline() == nil; try++ {
			ctx, cancel := context.WithTimeout(s.bgCtx, s.cfg.ReadTimeout)
			observed := s.cfg.Now().UnixNano()
			r, err := b.Source.Sample(ctx)
			cancel()
			if err == nil && s.IsBound(b) {
				b.Activation.Observe(r, observed)
				if b.Activation.Baseline() != nil {
					break
				}
				// A partial reading (or one without CPU) is no baseline: read
				// again after the pause.
			}
			select {
			case <-s.bgCtx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 2*time.Second)
		}
		s.persistBaseline(b)
	})
}

// maxBaselineTries bounds the background reads of one epoch's baseline
// (about a minute at the 2 s pause).
const maxBaselineTries = 32

// persistBaseline saves b's baseline in the state file if b is still bound.
func (s *Store) persistBaseline(b *Binding) {
	base := b.Activation.Baseline()
	if base == nil {
		return
	}
	s.commit.Lock()
	defer s.commit.Unlock()
	if !s.IsBound(b) {
		return
	}
	if err := s.saveBindings(s.view.Load().bindings, s.cleared); err != nil {
		s.logger.Warn("could not persist the epoch baseline; a restart takes a later one", "actor_uid", b.Identity.ActorUID, "err", err)
	}
}

package identity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Lifecycle errors. A rejected call changes nothing.
var (
	// ErrNoWorkload: nothing is bound.
	ErrNoWorkload = errors.New("identity: no workload is bound")
	// ErrOtherWorkload: a different workload is bound (checkpoint it first).
	ErrOtherWorkload = errors.New("identity: a different workload is bound")
	// ErrActorMismatch: the call names an actor that is not the bound one.
	ErrActorMismatch = errors.New("identity: actor is not the bound one")
	// ErrNotPersisted: a state file could not be written (the cause, e.g.
	// ENOSPC, is wrapped too); the call changed nothing.
	ErrNotPersisted = errors.New("identity: state not persisted")
)

// Op is the lifecycle call that made a binding.
type Op string

const (
	OpRun     Op = "run"
	OpRestore Op = "restore"
)

// Binding is one workload bound to this daemon. It is immutable once
// published (its Activation is the one part that changes, and is safe for
// concurrent use); a new call publishes a new Binding.
type Binding struct {
	Identity      Identity
	Ref           source.SandboxRef
	Op            Op
	EpochUnixNano int64 // when this activation (Run/Restore) began
	// Source measures the sandbox; nil when it could not be opened (the
	// workload is then bound but not measurable). Host reads the runner-layer
	// views; nil when unavailable.
	Source source.Source
	Host   source.HostSampler
	// Activation is the read path's account of this activation.
	Activation *Activation
}

// Opener opens the measurement sources for a ref. A source that cannot
// measure yet must still open (and answer ErrNotMeasurable from Sample); an
// error here is reported to the caller and binds nothing.
type Opener func(ref source.SandboxRef) (source.Source, source.HostSampler, error)

// Defaults of Config.
const (
	DefaultReadTimeout    = 2 * time.Second
	DefaultEndedRetention = 15 * time.Minute
	DefaultEndedMax       = 64
)

// Config configures a Store.
type Config struct {
	// StateDir holds the state files; created if missing. Empty keeps
	// everything in memory only (tests).
	StateDir string
	Open     Opener
	Now      func() time.Time // default time.Now
	Logger   *slog.Logger
	// ReadTimeout bounds the final read of an activation at its end and each
	// try of a baseline read (statsd --read-timeout).
	ReadTimeout time.Duration
	// EndedRetention and EndedMax bound the ended activations kept (statsd
	// --ended-retention, --ended-max): none older, no more.
	EndedRetention time.Duration
	EndedMax       int
	// BaselineRetry is the first pause between baseline reads of an epoch
	// whose counters survive a restore (doubling up to 2 s); default 100 ms.
	BaselineRetry time.Duration
}

// Store holds the current Binding and the recently ended activations.
type Store struct {
	cfg    Config
	logger *slog.Logger

	lifecycle   sync.Mutex // serializes Bind, Release and persistence; readers never take it
	lastCleared string     // actor uid of the last Release, for safe retries; under lifecycle
	// view is what readers see: the bound workload and the ended
	// activations, replaced whole (under lifecycle) in one store, so a
	// reader never sees an activation both bound and ended, nor neither.
	view atomic.Pointer[view]

	// The baseline takers: one goroutine per binding that needs one, ended
	// by Close.
	bgCtx  context.Context
	bgStop context.CancelFunc
	bg     sync.WaitGroup
}

// NewStore loads the persisted binding and ended activations, if any, and
// opens the binding's sources. A state file that cannot be parsed or
// validated is moved aside (renamed with a ".corrupt-<unix nanos>" suffix)
// and logged, and the store starts without what it held. A binding whose
// end was recorded but not yet cleared (statsd stopped between the two
// writes of an end) is cleared now: the end happened.
func NewStore(cfg Config) (*Store, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Open == nil {
		cfg.Open = func(source.SandboxRef) (source.Source, source.HostSampler, error) { return nil, nil, nil }
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.EndedRetention <= 0 {
		cfg.EndedRetention = DefaultEndedRetention
	}
	if cfg.EndedMax <= 0 {
		cfg.EndedMax = DefaultEndedMax
	}
	if cfg.BaselineRetry <= 0 {
		cfg.BaselineRetry = 100 * time.Millisecond
	}
	s := &Store{cfg: cfg, logger: cfg.Logger}
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	s.publish(nil, nil)
	if cfg.StateDir == "" {
		return s, nil
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("identity: state dir: %w", err)
	}
	sweepTemps(cfg.StateDir, s.logger)
	st, err := s.loadBinding()
	if err != nil {
		return nil, err
	}
	ended, err := s.loadEnded()
	if err != nil {
		return nil, err
	}
	s.publish(nil, ended)
	s.lastCleared = st.LastCleared
	b := st.Binding
	if b != nil && s.endedOf(b.Identity.ActorUID, b.EpochUnixNano) != nil {
		s.logger.Warn("the bound activation's end was recorded but not cleared (statsd stopped mid-end): clearing it now",
			"actor_uid", b.Identity.ActorUID, "epoch_unix_nano", b.EpochUnixNano)
		if err := s.saveBinding(stateFile{Version: stateVersion, LastCleared: b.Identity.ActorUID}); err != nil {
			return nil, err
		}
		s.lastCleared, b = b.Identity.ActorUID, nil
	}
	if b != nil {
		binding := &Binding{Identity: b.Identity, Ref: b.Ref, Op: b.Op, EpochUnixNano: b.EpochUnixNano,
			Activation: newActivation(b.Ref, b.EpochUnixNano, b.Baseline)}
		binding.Source, binding.Host = s.openSources(b.Ref)
		s.publish(binding, ended)
		s.logger.Info("restored binding from state", "actor_uid", b.Identity.ActorUID, "class", b.Ref.Class, "epoch_unix_nano", b.EpochUnixNano)
		s.startBaseline(binding)
	}
	return s, nil
}

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

// view is one published state of the store: what is bound and what ended.
// Neither it nor the list it holds is modified once published.
type view struct {
	current *Binding
	ended   []*Ended // oldest first
}

// publish makes current and ended what readers see, together.
func (s *Store) publish(current *Binding, ended []*Ended) {
	s.view.Store(&view{current: current, ended: ended})
}

// Current returns the bound workload, or nil. It never blocks.
func (s *Store) Current() *Binding { return s.view.Load().current }

// Ended returns the ended activations still retained (none older than the
// retention), oldest first. It never blocks and never writes.
func (s *Store) Ended() []*Ended {
	_, ended := s.Snapshot()
	return ended
}

// Snapshot returns the bound workload (or nil) and the ended activations
// still retained, oldest first, as one state: an activation is either still
// bound or among the ended ones, never both and never neither (a Checkpoint
// publishes its record and forgets the workload in one step). It never
// blocks and never writes.
func (s *Store) Snapshot() (*Binding, []*Ended) {
	v := s.view.Load()
	cutoff := s.cfg.Now().Add(-s.cfg.EndedRetention).UnixNano()
	for i, e := range v.ended {
		if e.EndUnixNano >= cutoff {
			return v.current, v.ended[i:]
		}
	}
	return v.current, nil
}

// Bind binds a workload (Run or Restore). The same call repeated (same op,
// identity and ref) is a retry: it changes nothing and returns the current
// binding. Binding the same actor anew (another op or ref) ends the bound
// activation (replaced, returned) and starts a new epoch. While a different
// actor is bound it fails with ErrOtherWorkload. The state is persisted
// before the binding is published.
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
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	old := s.Current()
	if old != nil {
		if old.Identity.ActorUID != id.ActorUID {
			return nil, nil, fmt.Errorf("%w: actor %q is bound; checkpoint it before binding %q", ErrOtherWorkload, old.Identity.ActorUID, id.ActorUID)
		}
		if old.Op == op && old.Identity == id && old.Ref.Equal(ref) {
			return old, nil, nil
		}
	}
	var replaced *Ended
	ended := s.view.Load().ended
	if old != nil {
		replaced = endActivation(ctx, old, OutcomeReplaced, s.cfg.Now, s.cfg.ReadTimeout)
		var err error
		if ended, err = s.saveEnded(replaced); err != nil {
			return nil, nil, err
		}
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
	b := &Binding{Identity: id, Ref: ref, Op: op, EpochUnixNano: epoch, Activation: newActivation(ref, epoch, nil)}
	b.Source, b.Host = s.openSources(ref)
	b.Ref.SentryStartTicks = pinnedStart(b.Source)
	if err := s.saveBinding(stateFile{Version: stateVersion, Binding: &bindingState{Identity: id, Ref: b.Ref, Op: op, EpochUnixNano: epoch}}); err != nil {
		closeBinding(b, s.logger)
		if replaced != nil {
			// The old activation's end is recorded: forget it too, so memory
			// matches what a restart would find (NewStore clears a binding
			// whose end is recorded).
			s.publish(nil, ended)
			s.lastCleared = old.Identity.ActorUID
			closeBinding(old, s.logger)
		}
		return nil, replaced, err
	}
	s.publish(b, ended)
	s.lastCleared = ""
	if old != nil {
		closeBinding(old, s.logger)
	}
	s.startBaseline(b)
	return b, replaced, nil
}

// Release ends the bound activation (Checkpoint): it takes one last bounded
// reading, records the ended activation, and forgets the workload.
// Releasing the actor that was just released succeeds again and returns the
// same record, so a retry is safe; any other actor is ErrActorMismatch, or
// ErrNoWorkload when nothing is bound.
func (s *Store) Release(ctx context.Context, actorUID string) (*Ended, error) {
	if err := ValidateActorUID(actorUID); err != nil {
		return nil, err
	}
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	old := s.Current()
	switch {
	case old == nil && actorUID == s.lastCleared:
		return s.lastEndedOf(actorUID), nil
	case old == nil:
		return nil, fmt.Errorf("%w: nothing to checkpoint for actor %q", ErrNoWorkload, actorUID)
	case old.Identity.ActorUID != actorUID:
		return nil, fmt.Errorf("%w: actor %q is bound, not %q", ErrActorMismatch, old.Identity.ActorUID, actorUID)
	}
	e := endActivation(ctx, old, OutcomeCheckpointed, s.cfg.Now, s.cfg.ReadTimeout)
	ended, err := s.saveEnded(e)
	if err != nil {
		return nil, err
	}
	if err := s.saveBinding(stateFile{Version: stateVersion, LastCleared: actorUID}); err != nil {
		// The end is recorded, so a restart clears the binding: do it now.
		s.logger.Warn("checkpoint: the end is recorded but the cleared binding was not saved; a restart clears it", "err", err)
	}
	s.publish(nil, ended) // the record and the forgetting, seen together
	s.lastCleared = actorUID
	closeBinding(old, s.logger)
	return e, nil
}

// InLifecycle reports whether a lifecycle call is in progress now. It does not
// wait.
func (s *Store) InLifecycle() bool {
	if s.lifecycle.TryLock() {
		s.lifecycle.Unlock()
		return false
	}
	return true
}

// HoldLifecycle takes the lifecycle lock until release is called, as a long
// Run/Restore would. For tests that prove reads never wait for it.
func (s *Store) HoldLifecycle() (release func()) {
	s.lifecycle.Lock()
	return s.lifecycle.Unlock
}

// Close stops the baseline takers and closes the current binding's sources
// (at daemon shutdown). The binding itself stays persisted.
func (s *Store) Close() {
	s.bgStop()
	s.bg.Wait()
	if b := s.Current(); b != nil {
		closeBinding(b, s.logger)
	}
}

func closeBinding(b *Binding, logger *slog.Logger) {
	if b.Source != nil {
		if err := b.Source.Close(); err != nil {
			logger.Warn("closing source", "actor_uid", b.Identity.ActorUID, "err", err)
		}
	}
	if b.Host != nil {
		if err := b.Host.Close(); err != nil {
			logger.Warn("closing host sampler", "actor_uid", b.Identity.ActorUID, "err", err)
		}
	}
}

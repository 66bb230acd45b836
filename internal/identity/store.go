package identity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Lifecycle errors. A rejected call changes nothing.
var (
	// ErrNoWorkload: nothing at all is bound.
	ErrNoWorkload = errors.New("identity: no workload is bound")
	// ErrOtherWorkload: the sandbox a call names is measured for a
	// different actor (checkpoint that one first).
	ErrOtherWorkload = errors.New("identity: the sandbox is bound to a different workload")
	// ErrActorMismatch: workloads are bound, but not the actor the call
	// names.
	ErrActorMismatch = errors.New("identity: actor is not bound here")
	// ErrTooManyWorkloads: binding one more actor would pass the ceiling
	// (Config.MaxWorkloads).
	ErrTooManyWorkloads = errors.New("identity: too many workloads bound")
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
	Identity Identity
	// Ref is the sandbox as bound; its container set is the bind's
	// (Activation.Containers is the set now, which binding.json persists).
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
	// names is what Ref's sockets, pid file and sentry resolve to (safe for
	// concurrent use).
	names *names
	// breakdown is the source's persisted state (breakdown.go).
	breakdown *breakdownHolder
}

// Opener opens the measurement sources for a ref. A source that cannot
// measure yet must still open (and answer ErrNotMeasurable from Sample); an
// error here is reported to the caller and binds nothing.
type Opener func(ref source.SandboxRef) (source.Source, source.HostSampler, error)

// Defaults and bounds of Config.
const (
	DefaultReadTimeout    = 2 * time.Second
	DefaultEndedRetention = 15 * time.Minute
	DefaultEndedMax       = 64
	// DefaultMaxWorkloads is statsd's --max-workloads: upstream's discovery
	// read fans out to 32 guests at once, and 32 samples of the usual size
	// fit one StatsActiveWorkloads answer uncut.
	DefaultMaxWorkloads = 32
	// LimitMaxWorkloads bounds --max-workloads: every binding must keep a
	// fair share of one 56 KiB discovery answer (at least 896 bytes), and
	// the binding state file stays small.
	LimitMaxWorkloads = 64
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
	// MaxWorkloads is how many actors may be bound at once (statsd
	// --max-workloads); default DefaultMaxWorkloads, at most
	// LimitMaxWorkloads.
	MaxWorkloads int
	// BaselineRetry is the first pause between baseline reads of an epoch
	// whose counters survive a restore (doubling up to 2 s); default 100 ms.
	BaselineRetry time.Duration
	// BreakdownSaveInterval is how often, at most, a changed source state
	// (source.Persistent) alone rewrites binding.json; default
	// DefaultBreakdownSaveInterval.
	BreakdownSaveInterval time.Duration
}

// Store holds the bound workloads and the recently ended activations.
//
// Lifecycle calls of one actor are serialized (actorLocks); calls of
// different actors run at once, and only their commit (the state files and
// the publish) is serialized under commit, which is never held across a
// source read. Readers never take either lock.
type Store struct {
	cfg    Config
	logger *slog.Logger
	// g bounds the stats and pid file reads that resolve a ref's names.
	g *bounded.Group

	actorMu    sync.Mutex            // guards actorLocks
	actorLocks map[string]*actorLock // the lifecycle lock of each actor in a call

	commit sync.Mutex // serializes the state files and the publish
	// cleared lists the actors whose last activation a Checkpoint ended and
	// that were not bound since (newest last, at most EndedMax), so that a
	// retried Checkpoint succeeds again; under commit.
	cleared []string
	// view is what readers see: the bound workloads and the ended
	// activations, replaced whole (under commit) in one store, so a reader
	// never sees an activation both bound and ended, nor neither.
	view atomic.Pointer[view]
	// ledger numbers the ended records (ledger.go); under commit, published
	// with them.
	ledger *ledger

	// persistWake wakes persistExited (nil without a state dir).
	persistWake chan struct{}
	// bdArmed: a save of the sources' states is armed (breakdownSoon).
	bdArmed atomic.Bool

	// The baseline takers: one goroutine per binding that needs one, and
	// persistExited, ended by Close.
	bgCtx  context.Context
	bgStop context.CancelFunc
	bg     sync.WaitGroup
}

type actorLock struct {
	mu    sync.Mutex
	users int // calls holding or waiting for mu; under Store.actorMu
}

// NewStore loads the persisted bindings and ended activations, if any, and
// opens the bindings' sources. A state file that cannot be parsed or
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
	if cfg.MaxWorkloads <= 0 {
		cfg.MaxWorkloads = DefaultMaxWorkloads
	}
	if cfg.MaxWorkloads > LimitMaxWorkloads {
		return nil, fmt.Errorf("%w: at most %d workloads per statsd, not %d", ErrInvalid, LimitMaxWorkloads, cfg.MaxWorkloads)
	}
	if cfg.BaselineRetry <= 0 {
		cfg.BaselineRetry = 100 * time.Millisecond
	}
	if cfg.BreakdownSaveInterval <= 0 {
		cfg.BreakdownSaveInterval = DefaultBreakdownSaveInterval
	}
	s := &Store{cfg: cfg, logger: cfg.Logger, g: bounded.New(cfg.ReadTimeout), actorLocks: map[string]*actorLock{}}
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	s.publish(nil, nil)
	if cfg.StateDir == "" {
		return s, nil
	}
	s.persistWake = make(chan struct{}, 1) // persistExited starts once the state loaded
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
	s.cleared = st.cleared()
	var (
		restored  []*Binding
		clearedAt []string
	)
	for _, b := range st.bindings() {
		if s.endedOf(b.Identity.ActorUID, b.EpochUnixNano) != nil {
			s.logger.Warn("a bound activation's end was recorded but not cleared (statsd stopped mid-end): clearing it now",
				"actor_uid", b.Identity.ActorUID, "epoch_unix_nano", b.EpochUnixNano)
			clearedAt = append(clearedAt, b.Identity.ActorUID)
			continue
		}
		binding := &Binding{Identity: b.Identity, Ref: b.Ref, Op: b.Op, EpochUnixNano: b.EpochUnixNano,
			Activation: newActivation(b.Ref, b.EpochUnixNano, b.Baseline), names: newNames(b.Ref, resolved{}),
			breakdown: s.newBreakdownHolder(b.Identity.ActorUID, b.Breakdown)}
		if b.Exited != nil {
			binding.Activation.restoreExited(b.Ref.ContainerSet(), *b.Exited)
		}
		binding.Activation.exitedChanged = s.persistSoon
		binding.Activation.sampled = s.breakdownSoon
		restored = append(restored, binding)
	}
	if over := len(restored) - cfg.MaxWorkloads; over > 0 {
		// --max-workloads was lowered across the restart: the bindings stay
		// (a launcher's acknowledged Run is never dropped); new ones wait
		// until the count is under the ceiling again.
		s.logger.Warn("more workloads restored than --max-workloads allows; none is dropped, new ones are refused until enough end",
			"restored", len(restored), "max_workloads", cfg.MaxWorkloads)
	}
	if len(clearedAt) > 0 {
		for _, a := range clearedAt {
			s.cleared = addCleared(s.cleared, a, cfg.EndedMax)
		}
		if err := s.saveBindings(restored, s.cleared); err != nil {
			return nil, err
		}
	}
	for _, b := range restored {
		b.Source, b.Host = s.openSources(b.Ref)
		s.guard(b) // its names are looked at again at its reads
		s.restoreBreakdown(b)
	}
	s.publish(restored, ended)
	s.bg.Go(s.persistExited)
	for _, b := range restored {
		s.logger.Info("restored binding from state", "actor_uid", b.Identity.ActorUID, "class", b.Ref.Class, "epoch_unix_nano", b.EpochUnixNano)
		s.startBaseline(b)
	}
	return s, nil
}

// MaxWorkloads is how many actors may be bound at once.
func (s *Store) MaxWorkloads() int { return s.cfg.MaxWorkloads }

// ReadTimeout is the bound of a read the store makes (Config.ReadTimeout).
func (s *Store) ReadTimeout() time.Duration { return s.cfg.ReadTimeout }

// view is one published state of the store: what is bound and what ended.
// Neither it nor the lists it holds is modified once published.
type view struct {
	bindings []*Binding // sorted by actor uid
	ended    []*Ended   // oldest first
	ledger   *ledger    // numbers ended
}

// bound returns the binding of actorUID in v, or nil.
func (v *view) bound(actorUID string) *Binding {
	i, ok := slices.BinarySearchFunc(v.bindings, actorUID, func(b *Binding, a string) int {
		return strings.Compare(b.Identity.ActorUID, a)
	})
	if !ok {
		return nil
	}
	return v.bindings[i]
}

// publish makes bindings and ended what readers see, together. bindings is
// sorted here; the caller must not use the slice afterwards.
func (s *Store) publish(bindings []*Binding, ended []*Ended) {
	slices.SortFunc(bindings, func(a, b *Binding) int { return strings.Compare(a.Identity.ActorUID, b.Identity.ActorUID) })
	if s.ledger == nil {
		s.ledger = newLedger() // NewStore's first publish: a new instance until loadEnded
	}
	s.view.Store(&view{bindings: bindings, ended: ended, ledger: s.ledger})
}

// Bound returns the binding of actorUID, or nil. It never blocks.
func (s *Store) Bound(actorUID string) *Binding { return s.view.Load().bound(actorUID) }

// IsBound reports whether b is still published: the same activation of the
// same actor, not a later one. It never blocks.
func (s *Store) IsBound(b *Binding) bool { return b != nil && s.Bound(b.Identity.ActorUID) == b }

// Bindings returns the bound workloads, sorted by actor uid. The slice is
// shared: do not modify it. It never blocks.
func (s *Store) Bindings() []*Binding { return s.view.Load().bindings }

// Ended returns the ended activations still retained (none older than the
// retention), oldest first. It never blocks and never writes.
func (s *Store) Ended() []*Ended {
	_, ended := s.Snapshot()
	return ended
}

// Snapshot returns the bound workloads (sorted by actor uid; shared, do not
// modify) and the ended activations still retained, oldest first, as one
// state: an activation is either still bound or among the ended ones, never
// both and never neither (a Checkpoint publishes its record and forgets the
// workload in one step). It never blocks and never writes.
func (s *Store) Snapshot() ([]*Binding, []*Ended) {
	v := s.view.Load()
	if i := v.heldFrom(s.cutoff()); i < len(v.ended) {
		return v.bindings, v.ended[i:]
	}
	return v.bindings, nil
}

// lockActor takes actorUID's lifecycle lock and returns its release.
func (s *Store) lockActor(actorUID string) (unlock func()) {
	s.actorMu.Lock()
	l := s.actorLocks[actorUID]
	if l == nil {
		l = &actorLock{}
		s.actorLocks[actorUID] = l
	}
	l.users++
	s.actorMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.actorMu.Lock()
		if l.users--; l.users == 0 {
			delete(s.actorLocks, actorUID)
		}
		s.actorMu.Unlock()
	}
}

// InLifecycle reports whether a lifecycle call of actorUID is in progress
// now. It does not wait.
func (s *Store) InLifecycle(actorUID string) bool {
	s.actorMu.Lock()
	defer s.actorMu.Unlock()
	return s.actorLocks[actorUID] != nil
}

// HoldLifecycle takes actorUID's lifecycle lock until release is called, as
// a long Run/Restore of that actor would. For tests that prove reads never
// wait for it.
func (s *Store) HoldLifecycle(actorUID string) (release func()) {
	return s.lockActor(actorUID)
}

// Close stops the baseline takers and closes the bindings' sources (at
// daemon shutdown). The bindings themselves stay persisted: an exit that
// persistExited had not written yet (woken while it wrote, or as it
// stopped) is written now.
func (s *Store) Close() {
	s.bgStop()
	s.bg.Wait()
	s.flushExited()            // an exit found by a read, its save still pending
	s.saveBreakdownIfChanged() // the sources' state since the last save (at most one more write)
	for _, b := range s.Bindings() {
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

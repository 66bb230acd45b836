package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
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
)

// Op is the lifecycle call that made a binding.
type Op string

const (
	OpRun     Op = "run"
	OpRestore Op = "restore"
)

// Binding is one workload bound to this daemon. It is immutable once
// published; a new call publishes a new Binding.
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
}

// Opener opens the measurement sources for a ref. A source that cannot
// measure yet must still open (and answer ErrNotMeasurable from Sample); an
// error here is reported to the caller and binds nothing.
type Opener func(ref source.SandboxRef) (source.Source, source.HostSampler, error)

// Store holds the current Binding.
type Store struct {
	dir    string
	open   Opener
	now    func() time.Time
	logger *slog.Logger

	lifecycle   sync.Mutex // serializes Bind and Release; readers never take it
	current     atomic.Pointer[Binding]
	lastCleared string // actor uid of the last Release, for safe retries; under lifecycle
}

// StateFileName is the file under the state directory that holds the binding.
const StateFileName = "binding.json"

const stateVersion = 1

type stateFile struct {
	Version     int           `json:"version"`
	Binding     *bindingState `json:"binding,omitempty"`
	LastCleared string        `json:"last_cleared_actor_uid,omitempty"`
}

type bindingState struct {
	Identity      Identity          `json:"identity"`
	Ref           source.SandboxRef `json:"ref"`
	Op            Op                `json:"op"`
	EpochUnixNano int64             `json:"epoch_unix_nano"`
}

// Config configures a Store.
type Config struct {
	// StateDir holds the state file; created if missing. Empty keeps the
	// binding in memory only (tests).
	StateDir string
	Open     Opener
	Now      func() time.Time // default time.Now
	Logger   *slog.Logger
}

// NewStore loads the persisted binding, if any, and opens its sources. A
// state file that cannot be parsed or validated is moved aside (renamed with a
// ".corrupt-<unix nanos>" suffix) and logged, and the store starts empty.
func NewStore(cfg Config) (*Store, error) {
	s := &Store{dir: cfg.StateDir, open: cfg.Open, now: cfg.Now, logger: cfg.Logger}
	if s.now == nil {
		s.now = time.Now
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.open == nil {
		s.open = func(source.SandboxRef) (source.Source, source.HostSampler, error) { return nil, nil, nil }
	}
	if s.dir == "" {
		return s, nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("identity: state dir: %w", err)
	}
	st, err := s.load()
	if err != nil {
		return nil, err
	}
	s.lastCleared = st.LastCleared
	if b := st.Binding; b != nil {
		binding := &Binding{Identity: b.Identity, Ref: b.Ref, Op: b.Op, EpochUnixNano: b.EpochUnixNano}
		binding.Source, binding.Host = s.openSources(b.Ref)
		s.current.Store(binding)
		s.logger.Info("restored binding from state", "actor_uid", b.Identity.ActorUID, "class", b.Ref.Class, "epoch_unix_nano", b.EpochUnixNano)
	}
	return s, nil
}

func (s *Store) statePath() string { return filepath.Join(s.dir, StateFileName) }

// load reads the state file; a missing file is an empty state, a bad one is
// moved aside.
func (s *Store) load() (stateFile, error) {
	p := s.statePath()
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return stateFile{Version: stateVersion}, nil
	case err != nil:
		// EIO, EACCES, EMFILE: the file may be fine; moving it aside would
		// forget a good binding. Refuse to start instead.
		return stateFile{}, fmt.Errorf("identity: read state: %w", err)
	}
	var st stateFile
	if err = decodeState(b, &st); err == nil {
		return st, nil
	}
	aside, rerr := atomicfile.MoveAside(p, s.now().UnixNano())
	if rerr != nil {
		return stateFile{}, fmt.Errorf("identity: state file %s is unreadable (%v) and could not be moved aside: %w", p, err, rerr)
	}
	s.logger.Error("state file unreadable; moved aside, starting with no workload", "path", p, "moved_to", aside, "err", err)
	return stateFile{Version: stateVersion}, nil
}

func decodeState(b []byte, st *stateFile) error {
	if err := json.Unmarshal(b, st); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("unknown state version %d", st.Version)
	}
	if st.Binding != nil {
		if err := st.Binding.Identity.Validate(); err != nil {
			return err
		}
		if err := ValidateRef(st.Binding.Ref); err != nil {
			return err
		}
		if st.Binding.Op != OpRun && st.Binding.Op != OpRestore {
			return fmt.Errorf("unknown op %q", st.Binding.Op)
		}
	}
	return nil
}

// save writes the state crash-safely (see atomicfile).
func (s *Store) save(st stateFile) error {
	if s.dir == "" {
		return nil
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.dir, StateFileName, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("identity: save state: %w", err)
	}
	return nil
}

func (s *Store) openSources(ref source.SandboxRef) (source.Source, source.HostSampler) {
	src, host, err := s.open(ref)
	if err != nil {
		// Bound but not measurable: the identity still holds, so a workload
		// that cannot be measured is still attributed.
		s.logger.Warn("could not open measurement source", "class", ref.Class, "err", err)
	}
	return src, host
}

// Current returns the bound workload, or nil. It never blocks.
func (s *Store) Current() *Binding { return s.current.Load() }

// Bind binds a workload (Run or Restore). The same call repeated (same op,
// identity and ref) is a retry: it changes nothing and returns the current
// binding. Binding the same actor anew (another op or ref) starts a new
// epoch. While a different actor is bound it fails with ErrOtherWorkload.
// The state is persisted before the binding is published.
func (s *Store) Bind(op Op, id Identity, ref source.SandboxRef) (*Binding, error) {
	if op != OpRun && op != OpRestore {
		return nil, fmt.Errorf("%w: unknown op %q", ErrInvalid, op)
	}
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if err := ValidateRef(ref); err != nil {
		return nil, err
	}
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()

	old := s.current.Load()
	if old != nil {
		if old.Identity.ActorUID != id.ActorUID {
			return nil, fmt.Errorf("%w: actor %q is bound; checkpoint it before binding %q", ErrOtherWorkload, old.Identity.ActorUID, id.ActorUID)
		}
		if old.Op == op && old.Identity == id && old.Ref.Equal(ref) {
			return old, nil
		}
	}
	epoch := s.now().UnixNano()
	if old != nil && epoch <= old.EpochUnixNano {
		epoch = old.EpochUnixNano + 1 // epochs only move forward
	}
	b := &Binding{Identity: id, Ref: ref, Op: op, EpochUnixNano: epoch}
	b.Source, b.Host = s.openSources(ref)
	if err := s.save(stateFile{Version: stateVersion, Binding: &bindingState{Identity: id, Ref: ref, Op: op, EpochUnixNano: epoch}}); err != nil {
		if !errors.Is(err, atomicfile.ErrNotDurable) {
			closeBinding(b, s.logger)
			return nil, err
		}
		// The new state is in place but its directory entry may not survive
		// a crash: memory must match the file, so publish and say so.
		s.logger.Warn("binding saved but not known to be durable", "err", err)
	}
	s.current.Store(b)
	s.lastCleared = ""
	if old != nil {
		closeBinding(old, s.logger)
	}
	return b, nil
}

// Release forgets the bound workload (Checkpoint). Releasing the actor that
// was just released succeeds again, so a retry is safe; any other actor is
// ErrActorMismatch, or ErrNoWorkload when nothing is bound.
func (s *Store) Release(actorUID string) error {
	if err := ValidateActorUID(actorUID); err != nil {
		return err
	}
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()

	old := s.current.Load()
	switch {
	case old == nil && actorUID == s.lastCleared:
		return nil
	case old == nil:
		return fmt.Errorf("%w: nothing to checkpoint for actor %q", ErrNoWorkload, actorUID)
	case old.Identity.ActorUID != actorUID:
		return fmt.Errorf("%w: actor %q is bound, not %q", ErrActorMismatch, old.Identity.ActorUID, actorUID)
	}
	if err := s.save(stateFile{Version: stateVersion, LastCleared: actorUID}); err != nil {
		if !errors.Is(err, atomicfile.ErrNotDurable) {
			return err
		}
		s.logger.Warn("checkpoint saved but not known to be durable", "err", err)
	}
	s.current.Store(nil)
	s.lastCleared = actorUID
	closeBinding(old, s.logger)
	return nil
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

// Close closes the current binding's sources (at daemon shutdown). The
// binding itself stays persisted.
func (s *Store) Close() {
	if b := s.current.Load(); b != nil {
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

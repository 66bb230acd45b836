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

	"github.com/sandboxstats/sandboxstats/internal/microvm"
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

	// The baseline takers: one goroutine per binding that needs one, ended
	// by Close.
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
	s := &Store{cfg: cfg, logger: cfg.Logger, actorLocks: map[string]*actorLock{}}
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
			Activation: newActivation(b.Ref, b.EpochUnixNano, b.Baseline)}
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
	}
	s.publish(restored, ended)
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

// admit reports why actor may not bind ref (its sources src, once opened)
// beside the bindings of v: the ceiling (for an actor not bound yet) and a
// sandbox measured for another actor. Nil admits it.
func (s *Store) admit(v *view, actorUID string, ref source.SandboxRef, src source.Source) error {
	for _, b := range v.bindings {
		if b.Identity.ActorUID == actorUID {
			continue
		}
		what := sameSandbox(b.Ref, ref)
		if what == "" {
			what = sameCgroup(cgroupOf(b.Ref, b.Source), cgroupOf(ref, src))
		}
		if what != "" {
			return fmt.Errorf("%w: %s is measured for actor %q; checkpoint it before binding %q", ErrOtherWorkload, what, b.Identity.ActorUID, actorUID)
		}
	}
	if v.bound(actorUID) == nil && len(v.bindings) >= s.cfg.MaxWorkloads {
		return fmt.Errorf("%w: %d of %d bound (statsd --max-workloads); checkpoint one before binding %q", ErrTooManyWorkloads, len(v.bindings), s.cfg.MaxWorkloads, actorUID)
	}
	return nil
}

// sameSandbox names what a and b share that makes them one sandbox (a
// cgroup or one nested in the other, a sentry, a guest, a VMM), or "".
func sameSandbox(a, b source.SandboxRef) string {
	switch {
	case a.CgroupPath != "" && b.CgroupPath != "":
		if what := sameCgroup(a.CgroupPath, b.CgroupPath); what != "" {
			return what
		}
	case a.SentryPID != 0 && a.SentryPID == b.SentryPID:
		return fmt.Sprintf("sentry pid %d", a.SentryPID)
	}
	switch {
	case a.AgentAddress != "" && b.AgentAddress != "" && sameGuest(a.AgentAddress, b.AgentAddress):
		return fmt.Sprintf("the guest of agent address %q", b.AgentAddress)
	case a.VMMPID != 0 && a.VMMPID == b.VMMPID:
		return fmt.Sprintf("vmm pid %d", a.VMMPID)
	case a.VMMPIDFile != "" && a.VMMPIDFile == b.VMMPIDFile:
		return fmt.Sprintf("vmm pid file %q", a.VMMPIDFile)
	case a.QMPSocket != "" && a.QMPSocket == b.QMPSocket:
		return fmt.Sprintf("qmp socket %q", a.QMPSocket)
	}
	return ""
}

// sameCgroup names the cgroup when a and b (paths under one mount, "" for
// unknown) are one cgroup or one holds the other (a parent's numbers hold
// its children's), or "".
func sameCgroup(a, b string) string {
	switch {
	case a == "" || b == "":
		return ""
	case a == b:
		return fmt.Sprintf("cgroup %q", a)
	case strings.HasPrefix(b, strings.TrimSuffix(a, "/")+"/"):
		return fmt.Sprintf("cgroup %q (holding %q)", a, b)
	case strings.HasPrefix(a, strings.TrimSuffix(b, "/")+"/"):
		return fmt.Sprintf("cgroup %q (inside %q)", a, b)
	}
	return ""
}

// sandboxCgrouper is a source that knows its sandbox's cgroup (the gVisor
// source, once it found the sentry).
type sandboxCgrouper interface {
	SandboxCgroup() (path string, ok bool)
}

// cgroupOf is the cgroup ref measures: its path, or where its source found
// the sentry; "" when unknown.
func cgroupOf(ref source.SandboxRef, src source.Source) string {
	if ref.CgroupPath != "" {
		return ref.CgroupPath
	}
	if c, ok := src.(sandboxCgrouper); ok {
		if p, ok := c.SandboxCgroup(); ok {
			return p
		}
	}
	return ""
}

// sameGuest reports whether two agent addresses reach one guest: one
// hybrid-vsock socket (any port) or one vsock CID (any port).
func sameGuest(a, b string) bool {
	pa, errA := microvm.ParseAddress(a)
	pb, errB := microvm.ParseAddress(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return pa.Scheme == pb.Scheme && pa.Path == pb.Path && pa.CID == pb.CID
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
		return old, nil, nil
	}
	if err := s.admit(s.view.Load(), id.ActorUID, ref, nil); err != nil {
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
	b := &Binding{Identity: id, Ref: ref, Op: op, EpochUnixNano: epoch, Activation: newActivation(ref, epoch, nil)}
	b.Source, b.Host = s.openSources(ref)
	b.Ref.SentryStartTicks = pinnedStart(b.Source)

	s.commit.Lock()
	defer s.commit.Unlock()
	v := s.view.Load()
	// Another actor's call may have committed while the sources opened.
	if err := s.admit(v, id.ActorUID, ref, b.Source); err != nil {
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
// daemon shutdown). The bindings themselves stay persisted.
func (s *Store) Close() {
	s.bgStop()
	s.bg.Wait()
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

package hoststat

// This file is the sampler: its configuration, and one host sample reading
// the three views concurrently, each reporting its own shortfall.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Default roots and bounds.
const (
	DefaultProcRoot    = "/proc"
	DefaultDebugfsRoot = "/sys/kernel/debug"
	DefaultReadTimeout = 2 * time.Second
	// DefaultMinInterval is how long a host sample is served to every
	// caller before another is taken.
	DefaultMinInterval = time.Second
)

// Sentinel errors, wrapped together with the source sentinels.
var (
	// errNoVMM: the SandboxRef names no VMM process for the thread and
	// debugfs views.
	errNoVMM = errors.New("hoststat: no VMM process in the sandbox ref")
)

// Config holds the roots and bounds of the host views. Zero fields take the
// Default values; a nil Logger discards.
type Config struct {
	ProcRoot    string // normally /proc (statsd --proc-root)
	DebugfsRoot string // normally /sys/kernel/debug (statsd --debugfs-root)
	ReadTimeout time.Duration
	Logger      *slog.Logger
	// DisableDebugfsMount forbids mounting debugfs at DebugfsRoot when it is
	// not mounted there. By default the KVM debugfs view mounts it inside a
	// private mount namespace of a locked thread that is discarded after the
	// read, so no mount is ever visible outside that thread.
	DisableDebugfsMount bool
	// MinInterval is how long a host sample is served from a cache before
	// another is taken (statsd --host-min-interval): readers, however many
	// and fast, never set the rate of samples (each may unshare a mount
	// namespace and mount debugfs). 0 means DefaultMinInterval; negative
	// turns the cache off.
	MinInterval time.Duration
	// Now is the clock for observed_at; nil means time.Now.
	Now func() time.Time
	// SandboxProcesses lists a gVisor sandbox's host processes for a
	// sentry_pid ref: the sentry first, then the rest (statsd passes
	// gvisor.SandboxProcesses). It blocks; the sampler runs it under
	// ReadTimeout. Nil: a sentry_pid ref gets no thread view, with why.
	SandboxProcesses func(procRoot string, sentryPID int32) ([]int32, error)
}

// sampler reads the host views of one sandbox. It keeps the previous
// sample's thread start times to detect tid reuse. Safe for concurrent use.
type sampler struct {
	ref source.SandboxRef
	cfg Config
	g   *bounded.Group
	log *slog.Logger

	// pin holds the VMM's (or sentry's) pid, start time and executable
	// from its first sample.
	pin *process.Tracker

	mu       sync.Mutex
	prevTids map[int32]uint64 // tid -> start time ticks, from the previous sample

	// qmpSchemas caches query-stats-schemas per QMP socket and VMM pid: the
	// schema is fixed for the life of a QEMU process.
	qmpMu      sync.Mutex
	qmpSchemas map[string]map[string]qmpSchema
}

var _ source.HostSampler = (*sampler)(nil)

// Open returns a HostSampler for the sandbox ref names. It reads nothing: a
// VMM that is not running yet shows up as a shortfall of the first sample.
// A sample is served to every caller for Config.MinInterval (observed_at
// says when it was taken). Close releases nothing today but must be called.
func Open(ref source.SandboxRef, cfg Config) (source.HostSampler, error) {
	s, err := newSampler(ref, cfg)
	if err != nil {
		return nil, err
	}
	interval := cfg.MinInterval
	if interval == 0 {
		interval = DefaultMinInterval
	}
	if interval < 0 {
		return s, nil
	}
	// Bounded by ReadTimeout per view, several views in turn: a waiting
	// caller gives up at its own deadline, the sample goes on.
	return &cachedSampler{s: s, interval: interval, g: bounded.New(0), now: time.Now}, nil
}

func newSampler(ref source.SandboxRef, cfg Config) (*sampler, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = DefaultProcRoot
	}
	if cfg.DebugfsRoot == "" {
		cfg.DebugfsRoot = DefaultDebugfsRoot
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if fi, err := os.Stat(cfg.ProcRoot); err != nil {
		return nil, fmt.Errorf("hoststat: proc root %s: %w", cfg.ProcRoot, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("hoststat: proc root %s: not a directory", cfg.ProcRoot)
	}
	return &sampler{
		ref: ref,
		cfg: cfg,
		g:   bounded.New(cfg.ReadTimeout),
		log: cfg.Logger.With("component", "hoststat"),
		pin: process.NewTracker(cfg.ProcRoot),
	}, nil
}

// SampleHost reads every host view once. The views are read concurrently,
// each under its own bound; each reports its own shortfall, so the error is
// always nil unless ctx is already done.
func (s *sampler) SampleHost(ctx context.Context) (*source.HostStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: host sample: %w", source.ErrTimeout, err)
	}
	hs := &source.HostStats{ObservedAtUnixNano: s.cfg.Now().UnixNano()}

	var wg sync.WaitGroup
	wg.Go(func() { hs.RunnerKernel = s.runnerKernel(ctx) })
	procs, how, perr := s.processes(ctx)
	var vmmPID int32
	if perr == nil && s.ref.SentryPID == 0 {
		vmmPID = procs[0]
	}
	hs.KVM = &source.KVMView{Legend: legendKVM}
	wg.Go(func() { hs.KVM.QMP = s.qmpView(ctx, vmmPID) })
	var debugfs *source.KVMSourceView
	wg.Go(func() {
		if perr != nil {
			debugfs = unavailableView(source.KVMSourceDebugfs, "", "VMM process unknown: "+perr.Error())
			return
		}
		if s.ref.VMMPID == 0 && s.ref.VMMPIDFile == "" {
			debugfs = &source.KVMSourceView{
				Source: source.KVMSourceDebugfs,
				State:  source.KVMSourceStateNotConfigured,
				Reason: "no VMM pid or pid file in the sandbox ref: no KVM VM to look up",
			}
			return
		}
		debugfs = s.debugfsView(ctx, procs[0])
	})
	threads, name, nameSource, reused := s.threadsView(ctx, procs, how, perr)
	wg.Wait()
	if reused != nil && debugfs.State != source.KVMSourceStateNotConfigured {
		debugfs = unavailableView(source.KVMSourceDebugfs, "", "VMM process unknown: "+reused.Error())
	}

	hs.VMMThreads = threads
	hs.KVM.Debugfs = debugfs
	hs.GuestName, hs.GuestNameSource = name, nameSource
	return hs, nil
}

// Close releases nothing (no file is held between samples); it is safe to
// call more than once.
func (s *sampler) Close() error { return nil }

// unavailableView is a KVM source that could not be read, with why.
func unavailableView(src source.KVMSource, origin, reason string) *source.KVMSourceView {
	return &source.KVMSourceView{Source: src, State: source.KVMSourceStateUnavailable, Origin: origin, Reason: reason}
}

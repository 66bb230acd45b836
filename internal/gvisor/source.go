// This file is the source: its Config, Open, Close and Sample, and the
// cgroupSource type that holds a sandbox's mounts, location and caches.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Defaults for the zero values of Config.
const (
	DefaultCgroupRoot  = "/sys/fs/cgroup"
	DefaultProcRoot    = "/proc"
	DefaultReadTimeout = 2 * time.Second
)

// Config holds the roots and bounds of a gVisor source. Zero values take the
// defaults above; a nil Logger discards.
type Config struct {
	CgroupRoot  string        // the cgroup mount, normally /sys/fs/cgroup
	ProcRoot    string        // normally /proc; used to resolve a sentry pid
	ReadTimeout time.Duration // bound of every file read
	Logger      *slog.Logger
	// Mode is the host's cgroup layout. ModeAuto (the zero value) detects it
	// once at Open from the file system types of CgroupRoot and
	// CgroupRoot/unified; set it to read a fixture tree.
	Mode Mode
	// RunscRoots are runsc root directories (runsc --root; under
	// containerd's runsc shim /run/containerd/runsc/k8s.io) whose state
	// files name the sandbox's containers; the sentry's control socket is
	// looked for there too. Empty: no per-container breakdown
	// (Reading.Containers stays empty, as before).
	RunscRoots []string
	// SentryTimeout bounds the one sentry call of a sample; 0 means
	// DefaultSentryTimeout. Capped by ReadTimeout.
	SentryTimeout time.Duration
	// SentryKeepFor is how long the breakdown keeps its connection to the
	// sentry after dialling it (sentryusage.Config.KeepFor); 0 means
	// sentryusage.DefaultKeepFor. A read at a longer interval dials anew.
	SentryKeepFor time.Duration
}

// errCgroupGone marks a read that found the cgroup directory missing, so
// that a source opened by sentry pid re-resolves the cgroup.
var errCgroupGone = fmt.Errorf("no such cgroup: %w", source.ErrSandboxGone)

// cgroupSource is the Source of one sandbox.
type cgroupSource struct {
	ref      source.SandboxRef
	mode     Mode
	procRoot string
	log      *slog.Logger
	g        *bounded.Group
	// readTimeout bounds the namespace scan withNS may run at a resolve.
	readTimeout time.Duration

	// v2: unified is the mount. v1: memory and cpuacct are the hierarchies;
	// cpuacct is nil (with cpuacctErr) when that hierarchy is not there.
	unified, memory, cpuacct *os.Root
	cpuacctErr               error
	// v1 and hybrid: the hierarchies of the signal files (hierarchies.go),
	// each nil with the reason when it is not mounted.
	aux auxRoots
	// pageSize decides which v1 memory.limit_in_bytes means no limit.
	pageSize uint64
	// pidsHidden: this process is in a pid namespace below ProcRoot's (a pod
	// without hostPID), where v1's cgroup.procs lists no sandbox process.
	pidsHidden bool
	// mroots: where the mounts are rooted in this process's cgroup
	// namespace (mount.go), found at Open for a source bound by sentry pid,
	// whose /proc/<pid>/cgroup paths are relative to that namespace; the
	// namespace's root in a mount rooted outside it is looked up at each
	// resolve (withNS).
	mroots mountRoots

	mu   sync.Mutex
	loc  *location            // nil until resolved (by sentry pid: at Open or a Sample); replaced when the cgroup disappears
	dirs map[dirID]*dirHandle // open cgroup directories
	// missing are the cgroup directories found missing, and when: an
	// optional read takes one as missing again until missingRecheck has
	// passed (dircache.go).
	missing map[dirID]time.Time
	// batchBytes is what the last sample read, the size of the next one's
	// buffer.
	batchBytes atomic.Int64
	// closed is set by Close: a directory opened afterwards is closed, not
	// cached.
	closed bool
	// sentry pins the sentry (its pid and start time) at the first resolve
	// that found the process; a later resolve that finds another start time
	// (or none) is a reused or exited pid. pinned says it is set.
	sentry process.Pin
	pinned bool
	// pinDir holds the pinned sentry's /proc/<pid> open for the network
	// (network.go).
	pinDir *pinDir

	// bd is the per-container breakdown; nil without RunscRoots.
	bd *breakdown

	closeOnce sync.Once
}

var _ source.Source = (*cgroupSource)(nil)

// Open returns a Source for the sandbox ref names (by cgroup path or sentry
// pid). The ref must be valid (identity.ValidateRef: class gvisor, exactly
// one of a positive sentry pid and an absolute, clean cgroup path without
// ".." that is not "/"); Open does not check it again. The cgroup files are
// opened through an os.Root on the mount, so a path that leads out of it
// through a symlink is refused when it is read. Open does not require the
// cgroup to exist yet: Sample then says source.ErrNotMeasurable. The cgroup
// mount itself must be there. Opened by sentry pid, Open resolves the
// sentry's cgroup through /proc/<pid>/cgroup and pins the sentry (pid and
// start time), within ReadTimeout, so that a sentry that dies before the
// first Sample is read from the cgroup it left; when that fails (the sentry
// not started yet, or already gone), the first Sample resolves it. A ref
// with SentryStartTicks (a binding statsd persisted) is pinned to that start
// time from the start: another process now holding the pid is refused.
// Close releases the mount handles.
func Open(ref source.SandboxRef, cfg Config) (source.Source, error) {
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = DefaultCgroupRoot
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = DefaultProcRoot
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &cgroupSource{
		ref:         ref,
		mode:        cfg.Mode,
		procRoot:    cfg.ProcRoot,
		g:           bounded.New(cfg.ReadTimeout),
		readTimeout: cfg.ReadTimeout,
		dirs:        map[dirID]*dirHandle{},
		pageSize:    uint64(os.Getpagesize()),
		pinDir:      newPinDir(),
		pidsHidden:  pidsHidden(cfg.ProcRoot),
	}
	if p := ref.CgroupPath; p != "" {
		s.loc = &location{mem: p, cpu: p, aux: samePath(p)}
	}
	if cfg.SentryTimeout <= 0 {
		cfg.SentryTimeout = DefaultSentryTimeout
	}
	bd, err := newBreakdown(cfg.RunscRoots, min(cfg.SentryTimeout, cfg.ReadTimeout), cfg.SentryKeepFor, ref, cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	s.bd = bd
	if bd != nil && ref.SentryPID != 0 {
		bd.own.pinned = func() (int, uint64, bool) { t, ok := s.SentryStartTicks(); return ref.SentryPID, t, ok }
	}
	if s.mode == ModeAuto {
		m, err := detectMode(cfg.CgroupRoot)
		if err != nil {
			return nil, err
		}
		s.mode = m
	}
	s.log = cfg.Logger.With("component", "gvisor", "mode", s.mode.String())
	switch s.mode {
	case ModeUnified:
		s.unified, err = os.OpenRoot(cfg.CgroupRoot)
	case ModeHybrid, ModeLegacy:
		if s.memory, err = os.OpenRoot(filepath.Join(cfg.CgroupRoot, "memory")); err != nil {
			break
		}
		// cpuacct may be co-mounted as "cpu,cpuacct" with a "cpuacct" symlink;
		// OpenRoot follows it.
		if s.cpuacct, s.cpuacctErr = os.OpenRoot(filepath.Join(cfg.CgroupRoot, "cpuacct")); s.cpuacctErr != nil {
			s.log.Debug("no cpuacct hierarchy: CPU will be absent", "err", s.cpuacctErr)
		}
		s.aux = openAuxRoots(cfg.CgroupRoot, s.mode, s.log)
	default:
		return nil, fmt.Errorf("gvisor: unknown cgroup mode %v", s.mode)
	}
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: cgroup mount: %w", source.ErrNotMeasurable, err)
	}
	if ref.SentryPID != 0 && ref.SentryStartTicks != 0 {
		// A binding restored by a restarted statsd: the sentry it pinned.
		s.sentry, s.pinned = process.Pin{PID: ref.SentryPID, StartTicks: ref.SentryStartTicks}, true
	}
	if ref.SentryPID != 0 {
		s.mroots = findMountRoots(context.Background(), s.g, cfg.CgroupRoot, s.mode, cfg.ProcRoot, os.Getpid(), s.log)
		// Resolve (and pin) the sentry's cgroup now, while the sentry is
		// most likely alive: a sentry that dies before the first Sample (an
		// early OOM kill) leaves its cgroup, and its memory.events, behind,
		// but no /proc/<pid>/cgroup to find it by. The read is bounded by
		// ReadTimeout (s.g); a failure leaves it to Sample.
		if _, err := s.locate(context.Background(), nil); err != nil {
			s.log.Debug("sentry's cgroup not resolved at open: resolving it at the first sample", "pid", ref.SentryPID, "err", err)
		}
	}
	return s, nil
}

// SentryStartTicks returns the start time the source pinned its sentry by
// (ok false: bound by path, or not pinned yet), for the binding to persist
// (source.SandboxRef.SentryStartTicks).
func (s *cgroupSource) SentryStartTicks() (ticks uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sentry.StartTicks, s.pinned
}

// SandboxCgroup is the sandbox's memory cgroup path under its mount: the
// ref's path, or where the sentry was found; ok is false while a source
// bound by sentry pid has not found it yet.
func (s *cgroupSource) SandboxCgroup() (path string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loc == nil {
		return "", false
	}
	return s.loc.mem, true
}

// Close releases the handles on the cgroup mounts and the breakdown's
// connection to the sentry. It is safe to call more than once; a read still
// hung in the kernel keeps its own file open.
func (s *cgroupSource) Close() error {
	s.closeOnce.Do(func() {
		s.pinDir.close()
		if s.bd != nil {
			s.bd.own.close()
			s.bd.close()
		}
		for _, r := range append([]*os.Root{s.unified, s.memory, s.cpuacct}, s.aux.all()...) {
			if r != nil {
				r.Close()
			}
		}
		s.mu.Lock()
		s.closed = true
		for k, h := range s.dirs {
			delete(s.dirs, k)
			s.dropLocked(h)
		}
		s.mu.Unlock()
	})
	return nil
}

// Sample reads the sandbox cgroup. A source opened by sentry pid reads the
// cgroup Open resolved (or resolves it now, when Open could not) and
// resolves it again when the cgroup it read before is gone.
func (s *cgroupSource) Sample(ctx context.Context) (source.Reading, error) {
	loc, err := s.locate(ctx, nil)
	if err != nil {
		return source.Reading{}, err
	}
	r, err := s.read(ctx, loc)
	if errors.Is(err, errCgroupGone) && s.ref.SentryPID != 0 {
		s.log.Debug("sandbox cgroup gone, resolving the sentry's cgroup again", "err", err)
		nloc, rerr := s.locate(ctx, loc)
		if rerr != nil {
			return source.Reading{}, rerr
		}
		if *nloc != *loc {
			r, err = s.read(ctx, nloc)
		}
	}
	return r, err
}

// locate returns the cached location unless it is stale (the one a read found
// gone), in which case it resolves the sentry pid's cgroup again.
func (s *cgroupSource) locate(ctx context.Context, stale *location) (*location, error) {
	s.mu.Lock()
	loc := s.loc
	s.mu.Unlock()
	if loc != nil && loc != stale {
		return loc, nil
	}
	if s.ref.SentryPID == 0 {
		return loc, nil // an explicit path never moves
	}
	nloc, err := s.resolve(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.loc != nil && s.loc != nloc {
		s.dropDirsOutsideLocked(nloc) // the old cgroups' handles and kept files
	}
	s.loc = nloc
	s.mu.Unlock()
	return nloc, nil
}

// read reads the cgroup files of loc and, for a source bound by sentry pid,
// the sentry's network counters at the same time.
func (s *cgroupSource) read(ctx context.Context, loc *location) (source.Reading, error) {
	nr := netResult{why: whyNoPID}
	var wg sync.WaitGroup
	if s.ref.SentryPID != 0 {
		wg.Go(func() { nr = s.readNetwork(ctx) })
	}
	var breakdown bounded.Pending[containerRead]
	if s.bd != nil {
		breakdown = s.bd.start(ctx)
	}
	var r source.Reading
	var err error
	if s.mode == ModeUnified {
		r, err = s.readV2(ctx, loc)
	} else {
		r, err = s.readV1(ctx, loc)
	}
	var (
		cr    containerRead
		crErr error
	)
	switch {
	case !breakdown.Started():
	case err != nil:
		breakdown.Abandon() // no sample to add it to: no wait for it
	default:
		cr, crErr = breakdown.Wait() // within its own bound, as the network read's
	}
	wg.Wait()
	if err == nil {
		err = nr.err
	}
	if err != nil {
		return source.Reading{}, err
	}
	addNetwork(&r, nr)
	if s.bd != nil {
		if crErr != nil {
			s.log.Debug("no per-container breakdown this sample", "err", crErr)
		} else if cr.ownErr != nil {
			s.log.Debug("a process of the sandbox not read this sample: its last figure kept", "err", cr.ownErr)
		}
		s.bd.addContainers(&r, cr, crErr)
	}
	if nr.exited {
		r.SentryExited = true
		r.Detail += ": the sentry has exited"
	}
	return r, nil
}

func (s *cgroupSource) suffix() string {
	if s.ref.SentryPID != 0 {
		return fmt.Sprintf(" (sentry pid %d)", s.ref.SentryPID)
	}
	return ""
}

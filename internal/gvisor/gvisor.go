package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
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
}

// errCgroupGone marks a read that found the cgroup directory missing, so
// that a source opened by sentry pid re-resolves the cgroup.
var errCgroupGone = fmt.Errorf("no such cgroup: %w", source.ErrSandboxGone)

// errRootCgroup: a sentry in the root cgroup (runsc --ignore-cgroups) has no
// cgroup of its own; the root's numbers would be the whole host's.
var errRootCgroup = errors.New("the sentry is in the root cgroup (runsc --ignore-cgroups?): the numbers there are the whole host's")

// location is where one sandbox's cgroup is, as paths relative to the mounts
// ("/a/b"). On v2 mem and cpu are the same path. cpu is "" when a resolved
// process has no cpuacct hierarchy.
type location struct {
	mem, cpu string
	// cpuWhy says why cpu is empty when the process has a cpuacct line.
	cpuWhy string
}

// cgroupSource is the Source of one sandbox.
type cgroupSource struct {
	ref      source.SandboxRef
	mode     Mode
	procRoot string
	log      *slog.Logger
	g        *bounded.Group

	// v2: unified is the mount. v1: memory and cpuacct are the hierarchies;
	// cpuacct is nil (with cpuacctErr) when that hierarchy is not there.
	unified, memory, cpuacct *os.Root
	cpuacctErr               error

	mu   sync.Mutex
	loc  *location             // nil until resolved; replaced when the cgroup disappears
	dirs map[string]*dirHandle // open cgroup directories, by display path
	// closed is set by Close: a directory opened afterwards is closed, not
	// cached.
	closed bool
	// sentryStart is the sentry's start time (field 22 of /proc/<pid>/stat),
	// recorded at the first resolve that found the process; a later resolve
	// that finds another start time (or none) is a reused or exited pid.
	sentryStart     uint64
	haveSentryStart bool

	closeOnce sync.Once
}

var _ source.Source = (*cgroupSource)(nil)

// dirHandle is an open cgroup directory and the number of reads using it
// (guarded by cgroupSource.mu). A handle dropped from the cache (its
// directory was removed, or the source closed) is closed by the last read
// that uses it, so no handle (and no dying memcg) is pinned until Close.
type dirHandle struct {
	r       *os.Root
	users   int
	dropped bool
}

// Open returns a Source for the sandbox ref names (by cgroup path or sentry
// pid). It does not require the cgroup to exist yet: Sample then says
// source.ErrNotMeasurable. The cgroup mount itself must be there. Close
// releases the mount handles.
func Open(ref source.SandboxRef, cfg Config) (source.Source, error) {
	if ref.Class != source.ClassGVisor && ref.Class != source.ClassUnspecified {
		return nil, fmt.Errorf("gvisor: sandbox class is %s", ref.Class)
	}
	if (ref.CgroupPath == "") == (ref.SentryPID == 0) {
		return nil, errors.New("gvisor: want exactly one of cgroup path and sentry pid")
	}
	if ref.SentryPID < 0 {
		return nil, fmt.Errorf("gvisor: sentry pid %d is not a pid", ref.SentryPID)
	}
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
		ref:      ref,
		mode:     cfg.Mode,
		procRoot: cfg.ProcRoot,
		g:        bounded.New(cfg.ReadTimeout),
		dirs:     map[string]*dirHandle{},
	}
	if ref.CgroupPath != "" {
		p, err := checkCgroupPath(ref.CgroupPath)
		if err != nil {
			return nil, fmt.Errorf("gvisor: cgroup path: %w", err)
		}
		s.loc = &location{mem: p, cpu: p}
	}
	if s.mode == ModeAuto {
		m, err := detectMode(cfg.CgroupRoot)
		if err != nil {
			return nil, err
		}
		s.mode = m
	}
	s.log = cfg.Logger.With("component", "gvisor", "mode", s.mode.String())
	var err error
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
	default:
		return nil, fmt.Errorf("gvisor: unknown cgroup mode %v", s.mode)
	}
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: cgroup mount: %w", source.ErrNotMeasurable, err)
	}
	return s, nil
}

// checkCgroupPath accepts an absolute, clean path without "..".
func checkCgroupPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%q is not absolute", p)
	}
	for e := range strings.SplitSeq(p, "/") {
		if e == ".." {
			return "", fmt.Errorf("%q contains \"..\"", p)
		}
	}
	if path.Clean(p) != p {
		return "", fmt.Errorf("%q is not clean", p)
	}
	if p == "/" {
		return "", errors.New(`"/" is the root cgroup: its numbers would be the whole host's`)
	}
	return p, nil
}

// Close releases the handles on the cgroup mounts. It is safe to call more
// than once; a read still hung in the kernel keeps its own file open.
func (s *cgroupSource) Close() error {
	s.closeOnce.Do(func() {
		for _, r := range []*os.Root{s.unified, s.memory, s.cpuacct} {
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

// Sample reads the sandbox cgroup. A source opened by sentry pid resolves the
// cgroup on first use and again when the cgroup it read before is gone.
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
	s.loc = nloc
	s.mu.Unlock()
	return nloc, nil
}

// errPidChanged: the start time of a pid changed between two reads of its
// stat file (the process exited and the pid was reused meanwhile).
var errPidChanged = errors.New("the process changed while its files were read")

// procSnap is one consistent look at a pid: its start time and cgroup file,
// read between two reads of its stat file that agree.
type procSnap struct {
	start  uint64
	cgroup []byte
}

// snapProc reads <dir>/stat, <dir>/cgroup and <dir>/stat again: if the two
// start times differ, the pid was reused between the reads.
func snapProc(dir string) (procSnap, error) {
	start := func() (uint64, error) {
		p := filepath.Join(dir, "stat")
		b, err := bounded.ReadFile(p, bounded.MaxFileBytes)
		if err != nil {
			return 0, err
		}
		v, err := parseStatStartTime(b)
		if err != nil {
			return 0, fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)
		}
		return v, nil
	}
	before, err := start()
	if err != nil {
		return procSnap{}, err
	}
	cg, err := bounded.ReadFile(filepath.Join(dir, "cgroup"), bounded.MaxFileBytes)
	if err != nil {
		return procSnap{}, err
	}
	after, err := start()
	if err != nil {
		return procSnap{}, err
	}
	if after != before {
		return procSnap{}, fmt.Errorf("%w: start time %d, then %d", errPidChanged, before, after)
	}
	return procSnap{start: before, cgroup: cg}, nil
}

// resolve finds the sentry's cgroup through <ProcRoot>/<pid>/cgroup. The
// first resolve records the sentry's start time; a later one refuses a pid
// that exited or now belongs to another process (same pid, another start
// time), so another workload's cgroup is never read under this identity.
func (s *cgroupSource) resolve(ctx context.Context) (*location, error) {
	pid := s.ref.SentryPID
	dir := filepath.Join(s.procRoot, strconv.Itoa(pid))
	p := filepath.Join(dir, "cgroup")
	s.mu.Lock()
	want, known := s.sentryStart, s.haveSentryStart
	s.mu.Unlock()
	snap, err := bounded.Do(ctx, s.g, "resolve\x00"+dir, func() (procSnap, error) { return snapProc(dir) })
	gone := errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, errPidChanged)
	switch {
	case known && gone:
		return nil, fmt.Errorf("gvisor: %w: %w: sentry pid %d was reused/exited (%s): %w", source.ErrNotMeasurable, source.ErrSandboxGone, pid, dir, err)
	case known && err == nil && snap.start != want:
		return nil, fmt.Errorf("gvisor: %w: %w: sentry pid %d was reused/exited: start time %d, was %d", source.ErrNotMeasurable, source.ErrSandboxGone, pid, snap.start, want)
	case gone:
		return nil, fmt.Errorf("gvisor: %w: sentry pid %d is gone (%s): %w", source.ErrNotMeasurable, pid, dir, err)
	case err != nil:
		return nil, wrapRead(err)
	}
	if !known {
		s.mu.Lock()
		if !s.haveSentryStart {
			s.sentryStart, s.haveSentryStart = snap.start, true
		}
		want = s.sentryStart
		s.mu.Unlock()
		if snap.start != want { // a concurrent first resolve saw another process
			return nil, fmt.Errorf("gvisor: %w: %w: sentry pid %d was reused/exited: start time %d, was %d", source.ErrNotMeasurable, source.ErrSandboxGone, pid, snap.start, want)
		}
	}
	pc, err := parseProcCgroup(snap.cgroup)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)
	}
	loc, err := selectLocation(pc, s.mode)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: sentry pid %d (%s): %w", source.ErrNotMeasurable, pid, p, err)
	}
	s.log.Debug("resolved sentry cgroup", "pid", pid, "start", snap.start, "memory", loc.mem, "cpu", loc.cpu)
	return loc, nil
}

// selectLocation picks the paths to read from a parsed /proc/<pid>/cgroup:
// the "0::" path on a unified host; the memory and cpuacct lines on a v1 or
// hybrid host (where the "0::" line is there too but has no memory
// controller). Paths are relative to the reader's cgroup namespace, which is
// also the root of a cgroup mount made inside it; a path outside the
// namespace shows as "/.." and cannot be read.
func selectLocation(pc procCgroup, mode Mode) (*location, error) {
	if mode == ModeUnified {
		if !pc.HasUnified {
			return nil, errors.New("no cgroup v2 (\"0::\") line")
		}
		p, err := namespacePath(pc.Unified)
		if err != nil {
			return nil, err
		}
		if p == "/" {
			return nil, errRootCgroup
		}
		return &location{mem: p, cpu: p}, nil
	}
	mp, ok := pc.V1["memory"]
	if !ok {
		return nil, errors.New("no v1 memory line")
	}
	mem, err := namespacePath(mp)
	if err != nil {
		return nil, err
	}
	if mem == "/" {
		return nil, errRootCgroup
	}
	loc := &location{mem: mem}
	if cp, ok := pc.V1["cpuacct"]; ok {
		if loc.cpu, err = namespacePath(cp); err != nil {
			return nil, err
		}
		// A process can sit in a memory cgroup of its own but in the root of
		// the separately mounted cpuacct hierarchy: that counter is the
		// whole host's, not the sandbox's.
		if loc.cpu == "/" {
			loc.cpu, loc.cpuWhy = "", "the sentry's cpuacct cgroup is the root: its counter would be the whole host's CPU"
		}
	}
	return loc, nil
}

func namespacePath(p string) (string, error) {
	if strings.HasSuffix(p, " (deleted)") {
		return "", fmt.Errorf("cgroup %q: %w", p, errCgroupGone)
	}
	for e := range strings.SplitSeq(p, "/") {
		if e == ".." {
			return "", fmt.Errorf("cgroup %q is outside this cgroup namespace", p)
		}
	}
	return path.Clean(p), nil
}

// rel turns a cgroup path into a name inside an os.Root.
func rel(p string) string {
	if p = strings.TrimPrefix(p, "/"); p == "" {
		return "."
	}
	return p
}

func display(root *os.Root, dir string) string {
	return filepath.Join(root.Name(), dir)
}

// wrapRead gives a read error that is neither a timeout nor malformed the
// not-measurable sentinel (permission denied, I/O error on a dying cgroup).
func wrapRead(err error) error {
	if errors.Is(err, source.ErrTimeout) || errors.Is(err, source.ErrMalformed) || errors.Is(err, source.ErrNotMeasurable) {
		return err
	}
	return fmt.Errorf("gvisor: %w: %w", source.ErrNotMeasurable, err)
}

// errClosed: the source was closed.
var errClosed = fmt.Errorf("gvisor: %w: source closed", source.ErrNotMeasurable)

// acquireDir returns the cgroup directory dir of root, opened once (inside
// root, so it cannot escape) and cached, so that each file read is a single
// openat. The caller uses it until releaseDir.
func (s *cgroupSource) acquireDir(ctx context.Context, root *os.Root, dir string) (*dirHandle, error) {
	key := display(root, dir)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	if h := s.dirs[key]; h != nil {
		h.users++
		s.mu.Unlock()
		return h, nil
	}
	s.mu.Unlock()
	d, err := bounded.Do(ctx, s.g, "dir\x00"+key, func() (*os.Root, error) {
		d, err := root.OpenRoot(rel(dir))
		if testHook != nil {
			testHook("open")
		}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close ran while the directory was being opened
		d.Close()
		return nil, errClosed
	}
	h := s.dirs[key]
	switch {
	case h != nil && h.r != d: // another caller won
		d.Close()
	case h == nil:
		h = &dirHandle{r: d}
		s.dirs[key] = h
	}
	h.users++
	return h, nil
}

// releaseDir ends one use of h; a dropped handle is closed by its last user.
func (s *cgroupSource) releaseDir(h *dirHandle) {
	if h == nil {
		return
	}
	s.mu.Lock()
	h.users--
	if h.dropped && h.users == 0 {
		h.r.Close()
	}
	s.mu.Unlock()
}

// dropLocked marks h no longer cached and closes it if no read uses it.
func (s *cgroupSource) dropLocked(h *dirHandle) {
	if h.dropped {
		return
	}
	h.dropped = true
	if h.users == 0 {
		h.r.Close()
	}
}

// forgetDir drops a cached directory that was removed (or removed and made
// again). Concurrent reads may still use it: the last of them closes it.
func (s *cgroupSource) forgetDir(root *os.Root, dir string, h *dirHandle) {
	key := display(root, dir)
	s.mu.Lock()
	if s.dirs[key] == h {
		delete(s.dirs, key)
		s.dropLocked(h)
	}
	s.mu.Unlock()
}

// readFile reads name in the cgroup dir of root. A missing file is reported
// as fs.ErrNotExist when the directory is there, and as errCgroupGone (with
// source.ErrNotMeasurable) when the directory is gone.
func (s *cgroupSource) readFile(ctx context.Context, root *os.Root, dir, name string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		if b, again, err := s.readFileOnce(ctx, root, dir, name, attempt); !again {
			return b, err
		}
	}
}

// readFileOnce is one attempt of readFile; again is true when the directory
// held open was replaced by a new one, which the next attempt opens.
func (s *cgroupSource) readFileOnce(ctx context.Context, root *os.Root, dir, name string, attempt int) (b []byte, again bool, err error) {
	h, err := s.acquireDir(ctx, root, dir)
	defer s.releaseDir(h)
	var d *os.Root
	if err == nil {
		d = h.r
		if b, err = s.g.ReadRootFile(ctx, d, name); err == nil {
			return b, false, nil
		}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, wrapRead(err)
	}
	// Is the directory still there, and still the one we hold open?
	exists, same, serr := s.dirState(ctx, root, dir, d)
	if serr != nil {
		return nil, false, wrapRead(serr)
	}
	if h != nil && !same {
		s.forgetDir(root, dir, h)
	}
	if !exists {
		return nil, false, fmt.Errorf("gvisor: %w: %s: %w", source.ErrNotMeasurable, display(root, dir), errCgroupGone)
	}
	if same || attempt > 0 {
		return nil, false, err // the file alone is missing: the caller decides
	}
	return nil, true, nil
}

// testHook, when a test sets it, runs inside the shared stat ("stat") and
// the open ("open", after it) of a cgroup directory, to hold that call.
var testHook func(op string)

// dirState says whether dir exists in root and, when d is not nil, whether it
// is still the directory d holds open. The stat of dir is one bounded call
// shared by concurrent callers, which may hold different handles: it returns
// only what it found, and each caller compares that with its own handle.
func (s *cgroupSource) dirState(ctx context.Context, root *os.Root, dir string, d *os.Root) (exists, same bool, err error) {
	type found struct{ fi fs.FileInfo } // nil fi: no such directory
	cur, err := bounded.Do(ctx, s.g, "stat\x00"+display(root, dir), func() (found, error) {
		if testHook != nil {
			testHook("stat")
		}
		fi, err := root.Stat(rel(dir))
		if errors.Is(err, fs.ErrNotExist) {
			return found{}, nil
		}
		return found{fi}, err
	})
	if err != nil || cur.fi == nil {
		return false, false, err
	}
	if d == nil {
		return true, false, nil
	}
	// This handle's own stat, shared only with callers holding the same one.
	held, err := bounded.Do(ctx, s.g, fmt.Sprintf("held\x00%p", d), func() (found, error) {
		fi, err := d.Stat(".")
		return found{fi}, err
	})
	if errors.Is(err, source.ErrTimeout) {
		return false, false, err
	}
	return true, err == nil && os.SameFile(cur.fi, held.fi), nil
}

// fileReq is one file a Sample reads; the reads of one Sample run
// concurrently, each bounded.
type fileReq struct {
	root      *os.Root
	dir, name string
	b         []byte
	err       error
}

func (s *cgroupSource) readAll(ctx context.Context, reqs []*fileReq) {
	var wg sync.WaitGroup
	for _, r := range reqs[1:] {
		wg.Go(func() { r.b, r.err = s.readFile(ctx, r.root, r.dir, r.name) })
	}
	reqs[0].b, reqs[0].err = s.readFile(ctx, reqs[0].root, reqs[0].dir, reqs[0].name)
	wg.Wait()
}

func (f *fileReq) path() string { return filepath.Join(display(f.root, f.dir), f.name) }

func (f *fileReq) malformed(err error) error {
	return fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, f.path(), err)
}

// reqUint parses a required one-number file.
func reqUint(f *fileReq) (uint64, error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, fmt.Errorf("gvisor: %w: %s has no %s", source.ErrNotMeasurable, display(f.root, f.dir), f.name)
	}
	if f.err != nil {
		return 0, f.err
	}
	v, err := parseSingleUint(f.b)
	if err != nil {
		return 0, f.malformed(err)
	}
	return v, nil
}

// optUint parses an optional one-number file: ok is false when the file
// alone is missing.
func optUint(f *fileReq) (v uint64, ok bool, err error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if f.err != nil {
		return 0, false, f.err
	}
	if v, err = parseSingleUint(f.b); err != nil {
		return 0, false, f.malformed(err)
	}
	return v, true, nil
}

// optKeyed finds key in an optional flat keyed file: ok is false when the
// file is missing or lacks the key.
func optKeyed(f *fileReq, key string) (v uint64, ok bool, err error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if f.err != nil {
		return 0, false, f.err
	}
	if v, ok, err = parseKeyed(f.b, key); err != nil {
		return 0, false, f.malformed(err)
	}
	return v, ok, nil
}

// readKeyed reads one flat keyed file and finds key in it.
func (s *cgroupSource) readKeyed(ctx context.Context, root *os.Root, dir, name, key string) (uint64, bool, error) {
	f := &fileReq{root: root, dir: dir, name: name}
	s.readAll(ctx, []*fileReq{f})
	return optKeyed(f, key)
}

// procs counts cgroup.procs into r; nil with an Absent when it is missing.
func procs(r *source.Reading, f *fileReq) error {
	if errors.Is(f.err, fs.ErrNotExist) {
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_processes", Reason: "no cgroup.procs in " + display(f.root, f.dir)})
		return nil
	}
	if f.err != nil {
		return f.err
	}
	n, err := parseProcs(f.b)
	if err != nil {
		return f.malformed(err)
	}
	r.SandboxProcesses = &n
	return nil
}

func (s *cgroupSource) read(ctx context.Context, loc *location) (source.Reading, error) {
	if s.mode == ModeUnified {
		return s.readV2(ctx, loc)
	}
	return s.readV1(ctx, loc)
}

func (s *cgroupSource) suffix() string {
	if s.ref.SentryPID != 0 {
		return fmt.Sprintf(" (sentry pid %d)", s.ref.SentryPID)
	}
	return ""
}

// workingSet is usage minus inactive file pages, floored at 0 (the two files
// are read a moment apart), or usage when inactive file is unknown.
func workingSet(usage, inactive uint64, ok bool) uint64 {
	if !ok {
		return usage
	}
	if inactive > usage {
		return 0
	}
	return usage - inactive
}

// readMemory fills current (required), peak (absent with peakMissing when the
// file is not there) and the working set (current minus the inactiveKey of
// memory.stat, floored at 0) from files already read.
func readMemory(r *source.Reading, cur, peak, stat *fileReq, inactiveKey, peakMissing string) error {
	var err error
	if r.MemoryCurrentBytes, err = reqUint(cur); err != nil {
		return err
	}
	p, ok, err := optUint(peak)
	if err != nil {
		return err
	}
	if ok {
		r.MemoryPeakBytes = &p
	} else {
		r.Absent = append(r.Absent, source.Absent{Field: "memory_peak_bytes", Reason: peakMissing})
	}
	inactive, ok, err := optKeyed(stat, inactiveKey)
	if err != nil {
		return err
	}
	r.MemoryWorkingSetBytes = workingSet(r.MemoryCurrentBytes, inactive, ok)
	return nil
}

// readV2 reads memory.current (required), memory.peak (optional, Linux 5.19+),
// memory.stat inactive_file, cpu.stat usage_usec and cgroup.procs.
func (s *cgroupSource) readV2(ctx context.Context, loc *location) (source.Reading, error) {
	root, dir := s.unified, loc.mem
	req := func(name string) *fileReq { return &fileReq{root: root, dir: dir, name: name} }
	cur, peak, stat, cpu, pr := req("memory.current"), req("memory.peak"), req("memory.stat"), req("cpu.stat"), req("cgroup.procs")
	s.readAll(ctx, []*fileReq{cur, peak, stat, cpu, pr})

	r := source.Reading{
		Kind:   source.KindCgroup,
		Detail: "cgroup v2 (unified) " + display(root, dir) + s.suffix(),
	}
	if err := readMemory(&r, cur, peak, stat, "inactive_file", "memory.peak not offered by this kernel (needs Linux 5.19): no "+peak.path()); err != nil {
		return source.Reading{}, err
	}
	usec, ok, err := optKeyed(cpu, "usage_usec")
	if err != nil {
		return source.Reading{}, err
	}
	if ok {
		r.CPUUsageUsec = &usec
	} else {
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "no usage_usec in " + cpu.path()})
	}
	if err := procs(&r, pr); err != nil {
		return source.Reading{}, err
	}
	return r, nil
}

// readV1 reads memory.usage_in_bytes (required), memory.max_usage_in_bytes,
// memory.stat total_inactive_file and cgroup.procs in the memory hierarchy,
// and cpuacct.usage (ns) in the cpuacct hierarchy.
func (s *cgroupSource) readV1(ctx context.Context, loc *location) (source.Reading, error) {
	root, dir := s.memory, loc.mem
	req := func(name string) *fileReq { return &fileReq{root: root, dir: dir, name: name} }
	cur, peak, stat, pr := req("memory.usage_in_bytes"), req("memory.max_usage_in_bytes"), req("memory.stat"), req("cgroup.procs")
	reqs := []*fileReq{cur, peak, stat, pr}
	var cpu *fileReq
	if s.cpuacct != nil && loc.cpu != "" {
		cpu = &fileReq{root: s.cpuacct, dir: loc.cpu, name: "cpuacct.usage"}
		reqs = append(reqs, cpu)
	}
	s.readAll(ctx, reqs)

	r := source.Reading{Kind: source.KindCgroup}
	cpuDetail := "cpuacct (none)"
	if cpu != nil {
		cpuDetail = "cpuacct " + display(cpu.root, cpu.dir)
	}
	r.Detail = fmt.Sprintf("cgroup v1 (%s) memory %s, %s%s", s.mode, display(root, dir), cpuDetail, s.suffix())

	if err := readMemory(&r, cur, peak, stat, "total_inactive_file", "no "+peak.path()); err != nil {
		return source.Reading{}, err
	}

	switch {
	case s.cpuacct == nil:
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "no cpuacct hierarchy: " + s.cpuacctErr.Error()})
	case cpu == nil && loc.cpuWhy != "":
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: loc.cpuWhy})
	case cpu == nil:
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "the sentry is in no cpuacct cgroup"})
	default:
		ns, err := reqUint(cpu)
		switch {
		case err == nil:
			usec := ns / 1000
			r.CPUUsageUsec = &usec
		case errors.Is(err, source.ErrNotMeasurable):
			// The memory cgroup is there but the cpuacct one is not.
			r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: err.Error()})
		default:
			return source.Reading{}, err
		}
	}
	if err := procs(&r, pr); err != nil {
		return source.Reading{}, err
	}
	return r, nil
}

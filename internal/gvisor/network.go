// This file reads the sandbox's network counters: the host kernel's
// /proc/<sentry pid>/net/dev, the counters of the network namespace the
// sentry runs in, read under the sentry's start-time pin.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// whyNoPID is the network's absent reason for a source bound by cgroup path.
const whyNoPID = "bound by cgroup path: no sentry pid, so no network namespace to read (bind by sentry pid for network counters)"

// netResult is the network part of a Reading, or why it is absent, or an
// error that fails the sample (a timeout, a malformed file).
type netResult struct {
	net *source.Network
	why string
	err error
	// exited: the pinned sentry has exited or its pid was reused.
	exited bool
}

// readNetwork reads <ProcRoot>/<sentry pid>/net/dev between two reads of
// the sentry's start time, which must both be the pinned one: a pid that
// exited or was reused is never read under this identity.
func (s *cgroupSource) readNetwork(ctx context.Context) netResult {
	pid := s.ref.SentryPID
	if pid == 0 {
		return netResult{why: whyNoPID}
	}
	s.mu.Lock()
	want, pinned := s.sentry.StartTicks, s.pinned
	s.mu.Unlock()
	if !pinned {
		return netResult{why: fmt.Sprintf("sentry pid %d is not pinned yet", pid)}
	}
	p := filepath.Join(s.procRoot, strconv.Itoa(pid), "net", "dev")
	b, err := bounded.Do(ctx, s.g, "netdev\x00"+p, func() ([]byte, error) { return snapNetDev(s.pinDir, s.procRoot, pid, want, p) })
	switch {
	case errors.Is(err, errPidChanged) || (process.IsGone(err) && !errors.Is(err, errNoNetDev)):
		return netResult{why: fmt.Sprintf("sentry pid %d was reused/exited: its network namespace is not read (%v)", pid, err), exited: true}
	case errors.Is(err, errNoNetDev):
		return netResult{why: "no " + p}
	case err != nil:
		return netResult{err: wrapRead(err)}
	}
	ifaces, err := parseNetDev(b)
	if err != nil {
		return netResult{err: fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)}
	}
	return netResult{net: source.NewNetwork(source.NetworkLayerHostNamespace, p, ifaces)}
}

// errNoNetDev: the sentry is there (same start time) but has no net/dev.
var errNoNetDev = errors.New("no net/dev file")

// snapNetDev reads the net/dev file p of pid between two reads of its start
// time, both of which must be want. Once they were, and on procfs, the
// pinned sentry's /proc/<pid> directory is held (pd): later reads open
// net/dev through it, with no start time to read.
func snapNetDev(pd *pinDir, procRoot string, pid int, want uint64, p string) ([]byte, error) {
	if b, ok, err := pd.readNetDev(p); ok {
		return b, err
	}
	check := func() error {
		st, err := startTime(procRoot, pid)
		if err != nil {
			return err
		}
		if st != want {
			return fmt.Errorf("%w: start time %d, pinned %d", errPidChanged, st, want)
		}
		return nil
	}
	if err := check(); err != nil {
		return nil, err
	}
	b, rerr := bounded.ReadFile(p, bounded.MaxFileBytes)
	if err := check(); err != nil {
		return nil, err
	}
	if process.IsGone(rerr) {
		return nil, fmt.Errorf("%w: %w", errNoNetDev, rerr)
	}
	if rerr == nil {
		pd.hold(procRoot, pid, want)
	}
	return b, rerr
}

// procSuperMagic is procfs's f_type (statfs(2)).
const procSuperMagic = 0x9fa0

// pinDir holds the pinned sentry's /proc/<pid> directory open once it was
// seen to be the pin. On procfs such a descriptor names that process only:
// a lookup in it (net/dev, stat) fails once the process has exited, even
// when its pid is reused by another process (the directory's inode keeps
// the old process's struct pid, which then has no task). So a sample reads
// net/dev with one openat(2) through it, where it read and parsed the
// sentry's stat (whose kernel side adds up every thread) before and after
// the read. On another file system (a test's fake /proc, whose files
// outlive their "process") nothing is held.
type pinDir struct {
	mu     sync.Mutex
	fd     int  // -1: none held
	busy   bool // a read is using fd: close leaves closing it to that read
	closed bool
}

func newPinDir() *pinDir { return &pinDir{fd: -1} }

// readNetDev reads net/dev through the held directory; ok is false when
// none is held (or it is in use: the caller reads by path). No lock is held
// during the I/O, so Close never waits for a read hung in the kernel.
func (pd *pinDir) readNetDev(p string) (b []byte, ok bool, err error) {
	pd.mu.Lock()
	fd := pd.fd
	if fd < 0 || pd.busy {
		pd.mu.Unlock()
		return nil, false, nil
	}
	pd.busy = true
	pd.mu.Unlock()
	b, drop, err := readNetDevAt(fd, p)
	pd.mu.Lock()
	pd.busy = false
	if drop || pd.closed {
		syscall.Close(fd)
		pd.fd = -1
	}
	pd.mu.Unlock()
	return b, true, err
}

// readNetDevAt reads net/dev through the /proc/<pid> directory fd. A
// lookup that fails asks the directory's stat why: the process gone (an
// error process.IsGone says so of) or a zombie (process.ErrExited), and
// drop says to hold the directory no more; else net/dev is missing
// (errNoNetDev).
func readNetDevAt(fd int, p string) (b []byte, drop bool, err error) {
	b, err = readAt(fd, "net/dev", p, bounded.MaxFileBytes)
	if err == nil {
		return b, false, nil
	}
	var buf [maxStatBytes]byte
	sp := filepath.Join(filepath.Dir(filepath.Dir(p)), "stat")
	st, serr := readAtInto(fd, "stat", sp, buf[:])
	var t procTimes
	if serr == nil {
		t, serr = parseProcStat(st)
	}
	switch {
	case serr == nil && (t.State == 'Z' || t.State == 'X'):
		serr = fmt.Errorf("%s: %w", sp, process.ErrExited)
	case errors.Is(serr, ErrProcStat):
		serr = fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, sp, serr)
	}
	if serr != nil {
		return nil, true, serr
	}
	if process.IsGone(err) {
		return nil, false, fmt.Errorf("%w: %w", errNoNetDev, err)
	}
	return nil, false, err
}

// hold opens <procRoot>/<pid> and keeps it when it is on procfs and its
// stat, read through it, still gives the pinned start time (the I/O
// outside the lock).
func (pd *pinDir) hold(procRoot string, pid int, want uint64) {
	pd.mu.Lock()
	skip := pd.fd >= 0 || pd.closed
	pd.mu.Unlock()
	if skip {
		return
	}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	var buf [maxStatBytes]byte
	b, err := readAtInto(fd, "stat", dir+"/stat", buf[:])
	var t procTimes
	if err == nil {
		t, err = parseProcStat(b)
	}
	var st unix.Statfs_t
	if err != nil || t.Start != want || t.State == 'Z' || t.State == 'X' || unix.Fstatfs(fd, &st) != nil || st.Type != procSuperMagic {
		syscall.Close(fd)
		return
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.fd >= 0 || pd.closed {
		syscall.Close(fd)
		return
	}
	pd.fd = fd
}

// close closes the held directory, or leaves that to the read using it;
// later reads check the start time again. Safe to call more than once.
func (pd *pinDir) close() {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	pd.closed = true
	if pd.fd >= 0 && !pd.busy {
		syscall.Close(pd.fd)
		pd.fd = -1
	}
}

// readAt reads name in the directory dirfd, at most max bytes (path names
// it in errors).
func readAt(dirfd int, name, path string, max int) ([]byte, error) {
	fd, err := unix.Openat(dirfd, name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err // an *fs.PathError naming path
	}
	if len(b) > max {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", source.ErrMalformed, path, max)
	}
	return b, nil
}

// readAtInto reads a /proc stat file name of dirfd into buf, in one read.
func readAtInto(dirfd int, name, path string, buf []byte) ([]byte, error) {
	fd, err := unix.Openat(dirfd, name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	return preadStat(fd, path, buf)
}

// addNetwork puts a network result into r.
func addNetwork(r *source.Reading, n netResult) {
	switch {
	case n.net == nil:
		absent(r, "network", n.why)
	case n.net.LoopbackOnly:
		r.Network = n.net
		absent(r, "network.total", "the sandbox's network namespace has no interface but loopback (runsc --network=none): no network, not a zero one")
	default:
		r.Network = n.net
	}
}

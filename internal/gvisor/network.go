// This file reads the sandbox's network counters: the host kernel's
// /proc/<sentry pid>/net/dev, the counters of the network namespace the
// sentry runs in, read under the sentry's start-time pin.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

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
	b, err := bounded.Do(ctx, s.g, "netdev\x00"+p, func() ([]byte, error) { return snapNetDev(s.pinStat, s.procRoot, pid, want, p) })
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
// time, both of which must be want (the pinned sentry's, through the held
// stat of ps).
func snapNetDev(ps *pinStat, procRoot string, pid int, want uint64, p string) ([]byte, error) {
	check := func() error {
		st, err := ps.start(procRoot, pid, want)
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
	return b, rerr
}

// procSuperMagic is procfs's f_type (statfs(2)).
const procSuperMagic = 0x9fa0

// pinStat holds the pinned sentry's /proc/<pid>/stat open once a read of it
// gave the pinned start time. On procfs a held descriptor names that process
// only: a read after it has exited fails with ESRCH, even once its pid is
// reused. So a sample checks the sentry with one pread(2) of the held
// descriptor and a parse that allocates nothing (parseProcStat), where it
// opened, read and parsed the file through procfs twice. On another file
// system (a test's fake /proc, whose files outlive their "process") nothing
// is held: each check opens the file anew.
type pinStat struct {
	mu     sync.Mutex
	fd     int // -1: none held
	closed bool
	buf    [maxStatBytes]byte
}

func newPinStat() *pinStat { return &pinStat{fd: -1} }

// start returns pid's start time, from the held descriptor once there is
// one. A gone process (its stat missing, ESRCH, or a zombie: ErrExited) is
// an error for which process.IsGone is true; a stat that does not parse is
// source.ErrMalformed.
func (ps *pinStat) start(procRoot string, pid int, want uint64) (uint64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	path := filepath.Join(procRoot, strconv.Itoa(pid), "stat")
	fd := ps.fd
	var b []byte
	var err error
	if fd >= 0 {
		b, err = preadStat(fd, path, ps.buf[:])
	} else {
		fd, b, err = openStat(path, ps.buf[:])
	}
	var t procTimes
	if err == nil {
		t, err = parseProcStat(b)
	}
	switch {
	case err == nil && (t.State == 'Z' || t.State == 'X'):
		err = fmt.Errorf("%s: %w", path, process.ErrExited)
	case errors.Is(err, ErrProcStat):
		err = fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, path, err)
	}
	hold := err == nil && t.Start == want && !ps.closed && onProcfs(fd)
	switch {
	case hold && fd == ps.fd:
	case hold:
		ps.fd = fd
	default:
		if fd >= 0 {
			syscall.Close(fd)
		}
		if fd == ps.fd {
			ps.fd = -1 // gone, or no longer the pin: nothing more to read through it
		}
	}
	if err != nil {
		return 0, err
	}
	return t.Start, nil
}

// onProcfs reports whether fd is a file of procfs.
func onProcfs(fd int) bool {
	var st syscall.Statfs_t
	return fd >= 0 && syscall.Fstatfs(fd, &st) == nil && st.Type == procSuperMagic
}

// close closes the held descriptor; later checks open their own. Safe to
// call more than once.
func (ps *pinStat) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	if ps.fd >= 0 {
		syscall.Close(ps.fd)
		ps.fd = -1
	}
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

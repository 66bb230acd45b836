// This file resolves a sentry pid to its cgroup through /proc, pinning the
// sentry by its start time so that a reused pid is never read as the sandbox.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// errPidChanged: the start time of a pid changed between two reads of its
// stat file (the process exited and the pid was reused meanwhile).
var errPidChanged = errors.New("the process changed while its files were read")

// procSnap is one consistent look at a pid: its start time and cgroup file,
// read between two reads of its start time that agree.
type procSnap struct {
	start  uint64
	cgroup []byte
}

// snapProc reads pid's start time (process.StartTime:
// <procRoot>/<pid>/stat), <procRoot>/<pid>/cgroup, and the start time again:
// if the two start times differ, the pid was reused between the reads.
func snapProc(procRoot string, pid int) (procSnap, error) {
	before, err := startTime(procRoot, pid)
	if err != nil {
		return procSnap{}, err
	}
	cg, err := bounded.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"), bounded.MaxFileBytes)
	if err != nil {
		return procSnap{}, err
	}
	after, err := startTime(procRoot, pid)
	if err != nil {
		return procSnap{}, err
	}
	if after != before {
		return procSnap{}, fmt.Errorf("%w: start time %d, then %d", errPidChanged, before, after)
	}
	return procSnap{start: before, cgroup: cg}, nil
}

// startTime is process.StartTime with a stat file that does not parse
// marked source.ErrMalformed (its error names the path).
func startTime(procRoot string, pid int) (uint64, error) {
	v, err := process.StartTime(procRoot, pid)
	if errors.Is(err, process.ErrMalformedStat) {
		return 0, fmt.Errorf("gvisor: %w: %w", source.ErrMalformed, err)
	}
	return v, err
}

// resolve finds the sentry's cgroup through <ProcRoot>/<pid>/cgroup. The
// first resolve pins the sentry (its pid and start time); a later one
// refuses a pid that exited or now belongs to another process (same pid,
// another start time), so another workload's cgroup is never read under this
// identity.
func (s *cgroupSource) resolve(ctx context.Context) (*location, error) {
	pid := s.ref.SentryPID
	dir := filepath.Join(s.procRoot, strconv.Itoa(pid))
	p := filepath.Join(dir, "cgroup")
	s.mu.Lock()
	want, known := s.sentry.StartTicks, s.pinned
	s.mu.Unlock()
	snap, err := bounded.Do(ctx, s.g, "resolve\x00"+dir, func() (procSnap, error) { return snapProc(s.procRoot, pid) })
	gone := process.IsGone(err) || errors.Is(err, errPidChanged)
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
		if !s.pinned {
			s.sentry, s.pinned = process.Pin{PID: pid, StartTicks: snap.start}, true
		}
		want = s.sentry.StartTicks
		s.mu.Unlock()
		if snap.start != want { // a concurrent first resolve saw another process
			return nil, fmt.Errorf("gvisor: %w: %w: sentry pid %d was reused/exited: start time %d, was %d", source.ErrNotMeasurable, source.ErrSandboxGone, pid, snap.start, want)
		}
	}
	pc, err := parseProcCgroup(snap.cgroup)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)
	}
	mr := s.mroots.withNS(ctx, s.readTimeout)
	loc, err := selectLocation(pc, s.mode, mr)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: sentry pid %d (%s): %w", source.ErrNotMeasurable, pid, p, err)
	}
	if s.mode != ModeUnified {
		loc.aux = selectAux(pc, s.mode, mr)
	}
	s.log.Debug("resolved sentry cgroup", "pid", pid, "start", snap.start, "memory", loc.mem, "cpu", loc.cpu)
	return loc, nil
}

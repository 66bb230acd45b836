// Package process answers, from /proc and pid files, which process a
// sandbox's helper is and whether it is still that process: the pid a pid
// file names, a process's start time (which, with the pid, names one
// process for the life of the machine), and whether a read failed because
// the process is gone. A Pin (pid, start time, executable) names one
// process; a Tracker pins the process behind a pid and refuses the pid once
// another process has it.
//
// gvisor (the sentry), hoststat (the VMM and its threads) and drift (the
// VMM, strays) share these, so that a pid file is parsed and a reused pid
// is recognised one way everywhere.
package process

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// ErrNotPID marks a pid file whose content is not one positive pid. Its
// errors give the content's length, never the content: a pid file is named
// by the launcher and may point anywhere.
var ErrNotPID = errors.New("process: not a pid")

// ErrMalformedStat marks a /proc file (a stat, a schedstat, /proc/stat)
// that could not be parsed (as opposed to one that could not be read).
var ErrMalformedStat = errors.New("process: malformed stat")

// ParsePIDFile parses a pid file's content: one positive decimal that fits
// a pid_t, with surrounding white space allowed.
func ParsePIDFile(b []byte) (int, error) {
	t := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(t, 10, 32)
	if err != nil || n <= 0 || n > math.MaxInt32 || t[0] == '+' {
		return 0, fmt.Errorf("%w: %d bytes", ErrNotPID, len(b))
	}
	return int(n), nil
}

// ReadPIDFile reads the pid a pid file names. The file must be a regular
// file (no symlink, FIFO or device) of at most bounded.MaxPIDFileBytes. It
// blocks only as long as reading a regular file does; callers still bound
// it. Errors name the path.
func ReadPIDFile(path string) (int, error) {
	b, err := bounded.ReadRegularFile(path, bounded.MaxPIDFileBytes)
	if err != nil {
		return 0, err
	}
	pid, err := ParsePIDFile(b)
	if err != nil {
		return 0, fmt.Errorf("pid file %s: %w", path, err)
	}
	return pid, nil
}

// ErrExited marks a process that has exited but is not reaped yet (a
// zombie): its pid still has a /proc directory, but the kernel moved it out
// of its cgroups (a zombie's /proc/<pid>/cgroup names the root cgroups).
var ErrExited = errors.New("process: exited (a zombie, not reaped yet)")

// IsGone reports whether err says the process is gone: its /proc directory
// is missing, it exited while a file of it was being read (ESRCH), or it is
// a zombie (ErrExited).
func IsGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, ErrExited)
}

// StartTime returns a process's start time, in clock ticks after boot
// (field 22 of <procRoot>/<pid>/stat, parsed from the last ')' since the
// command name may hold any byte). A gone process, a zombie
// included, gives an error for which IsGone is true.
func StartTime(procRoot string, pid int) (uint64, error) {
	st, err := ReadStat(filepath.Join(procRoot, strconv.Itoa(pid)))
	var pe *fs.PathError
	switch {
	case err == nil:
	case IsGone(err) || errors.As(err, &pe):
		return 0, fmt.Errorf("process: %s/%d/stat: %w", procRoot, pid, err)
	case errors.Is(err, ErrMalformedStat):
		return 0, fmt.Errorf("%s/%d/stat: %w", procRoot, pid, err)
	default:
		return 0, fmt.Errorf("%w: %s/%d/stat: %w", ErrMalformedStat, procRoot, pid, err)
	}
	if st.State == 'Z' || st.State == 'X' {
		return 0, fmt.Errorf("%s/%d: %w", procRoot, pid, ErrExited)
	}
	return st.Starttime, nil
}

// Pin names one process for the life of the machine: a pid and its start
// time. A pid alone may be reused by another process after the first exits.
// Exe, the target of /proc/<pid>/exe when it could be read ("" when not),
// also tells another program apart.
type Pin struct {
	PID        int
	StartTicks uint64
	Exe        string
}

// pinOf pins the process running as pid now.
func pinOf(procRoot string, pid int) (Pin, error) {
	start, err := StartTime(procRoot, pid)
	if err != nil {
		return Pin{}, err
	}
	return Pin{PID: pid, StartTicks: start, Exe: exeOf(procRoot, pid)}, nil
}

// exeOf is the executable of pid (the target of <procRoot>/<pid>/exe without
// the " (deleted)" the kernel appends when the file was replaced), or ""
// when it cannot be read (another user's process without privilege, a
// kernel thread, a process gone).
func exeOf(procRoot string, pid int) string {
	target, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(pid), "exe"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(target, " (deleted)")
}

// Running reports whether the pinned process still runs: false (with a nil
// error) when its pid is gone or now belongs to another process (another
// start time, or another executable when both are known).
func (p Pin) Running(procRoot string) (bool, error) {
	start, err := StartTime(procRoot, p.PID)
	switch {
	case IsGone(err):
		return false, nil
	case err != nil:
		return false, err
	}
	if start != p.StartTicks {
		return false, nil
	}
	if exe := exeOf(procRoot, p.PID); exe != "" && p.Exe != "" && exe != p.Exe {
		return false, nil
	}
	return true, nil
}

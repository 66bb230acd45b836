// This file measures a gVisor sandbox's own processes, the sentry and the
// gofers, from /proc: the host CPU the kernel charged them (utime+stime of
// /proc/<pid>/stat, exited threads included; once checked, the same sum
// from the process's CPU clock: owncpu_clock_linux.go), each process
// checked once to be the sandbox's and its last figure kept when it exits.

package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/process"
)

// ErrProcStat marks a /proc/<pid>/stat line that does not parse.
var ErrProcStat = errors.New("gvisor: /proc stat")

// tickUsec is one USER_HZ tick (the unit of /proc/<pid>/stat's times) in µs.
const tickUsec = 1_000_000 / process.UserHZ

// maxStatBytes caps one /proc/<pid>/stat (a line of about 300 bytes; the
// command name is at most 64).
const maxStatBytes = 4 << 10

// maxFdinfoBytes caps one /proc/self/fdinfo/<fd> of a pidfd (about 80
// bytes: short lines pos, flags, mnt_id, ino, Pid, and NSpid with one pid a
// pid namespace level).
const maxFdinfoBytes = 4 << 10

// procTimes is what statsd keeps of one /proc/<pid>/stat.
type procTimes struct {
	State byte   // field 3 ('R', 'S', 'Z', ...)
	Ticks uint64 // utime + stime (fields 14 and 15), USER_HZ ticks
	Start uint64 // starttime (field 22), clock ticks after boot
}

// parseProcStat parses a /proc/<pid>/stat line (process.ParseStatFields)
// into what statsd keeps of it, without allocating (it runs for every own
// process and the sentry's pin at every sample). Its errors wrap both
// ErrProcStat and process.ErrMalformedStat and do not name the file
// (callers do).
func parseProcStat(b []byte) (procTimes, error) {
	f, err := process.ParseStatFields(b)
	if err != nil {
		return procTimes{}, fmt.Errorf("%w: %w", ErrProcStat, err)
	}
	if f.UTime+f.STime < f.UTime {
		return procTimes{}, fmt.Errorf("%w: utime %d + stime %d overflows", ErrProcStat, f.UTime, f.STime)
	}
	return procTimes{State: f.State, Ticks: f.UTime + f.STime, Start: f.Starttime}, nil
}

// fdinfoNames reports whether a pidfd's fdinfo (/proc/<pid>/fdinfo/<fd>
// text) has the line "Pid:\t<pid>": its first "Pid:" line names pid, in
// decimal, and nothing else.
func fdinfoNames(fdinfo []byte, pid int) bool {
	for line := range bytes.SplitSeq(fdinfo, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Pid:")); ok {
			return string(bytes.TrimSpace(v)) == strconv.Itoa(pid)
		}
	}
	return false
}

// ownProc is one process the tracker looked at: its start time, whether it
// is the sandbox's (checked once per start time) and its last figure.
type ownProc struct {
	start uint64
	ok    bool
	usec  uint64 // its CPU, µs (its stat's ticks, or its clock's nanoseconds, truncated)
	// fd is what is held of the process once it is checked (-1: nothing):
	// a pidfd when clock (a read is then its CPU clock, owncpu_clock_linux.go),
	// else its /proc/<pid>/stat (one pread(2)). Either names that process
	// only (a reused pid is another process: ESRCH, or the pidfd exited).
	fd    int
	clock bool
}

// maxHeldStatFDs bounds the descriptors (pidfds or /proc stat) one sandbox
// holds (the sentry and the first gofers); the others' stat is opened at
// each read.
const maxHeldStatFDs = 8

// ownTracker adds up the host CPU of one sandbox's sentry and gofers. A
// process counts only once it is checked to be the sandbox's (argv[0]
// runsc-sandbox or runsc-gofer, and its --root= the runsc root or its
// cgroups the sentry's); a (pid, start time) is checked once. A process
// that exits, or whose pid now has another start time, keeps its last
// figure (done), so the total never goes down.
type ownTracker struct {
	procRoot string

	mu     sync.Mutex
	done   uint64 // µs of the sandbox's processes that are gone
	procs  map[int]ownProc
	held   int  // descriptors held (ownProc.fd)
	closed bool // close was called (or holding is off, for a fake /proc): hold nothing more
	// buf is the stat read buffer (on the heap: on a read's stack, 4 KiB
	// grew the goroutine's stack at every sample)
	buf [maxStatBytes]byte
	// kvm: the sentry (sentryStart) runs with --platform=kvm.
	kvm         bool
	sentryStart uint64
	// sentryWhy says why the sentry (started at whyStart) was not
	// accepted: the own share is then absent with it.
	sentryWhy string
	whyStart  uint64

	// cgroup and pinned verify a sentry started with another spelling of
	// the runsc root (a symlink, a mount at another path): its cgroups name
	// the bound cgroup, or it is the pinned sentry of a binding by pid.
	cgroup string
	pinned func() (pid int, start uint64, ok bool)

	// snap is what the last read leaves to persist (breakdownstate.go),
	// under snapMu so that a save never waits for a read.
	snapMu sync.Mutex
	snap   struct {
		done, sentryStart uint64
		kvm               bool
		procs             []procState
	}
}

func newOwnTracker(procRoot string) *ownTracker {
	return &ownTracker{procRoot: procRoot, procs: map[int]ownProc{}}
}

// ownRead is one look at the sandbox's own processes.
type ownRead struct {
	Usec   uint64 // the sentry's and gofers' host CPU, exited ones' last figures included
	KVM    bool   // the sentry runs under runsc's kvm platform
	Counts int    // processes counted now (alive and checked)
	// SentryWhy, when not "", says why the sentry is not counted (it could
	// not be verified to be this sandbox's): the own share is absent.
	SentryWhy string
}

// read reads the sentry's and gofers' stat (root is the runsc root their
// state files are in). A process that cannot be read keeps its last figure;
// the errors other than a process being gone are returned beside the
// figures.
func (o *ownTracker) read(root string, sentry int, gofers []int) (ownRead, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	want := map[int]bool{sentry: true}
	for _, g := range gofers {
		if g > 0 {
			want[g] = true
		}
	}
	for pid, p := range o.procs {
		if p.ok {
			want[pid] = true // read until it is gone: it keeps its last figure then
		} else if !want[pid] {
			delete(o.procs, pid)
		}
	}
	var errs []error
	var out ownRead
	var sentryCgroup []byte
	for pid := range want {
		if pid <= 0 {
			continue
		}
		p, known := o.procs[pid]
		if known && p.fd >= 0 && p.clock {
			if usec, live := clockUsec(pid, p.fd); live {
				p.usec = max(p.usec, usec)
				o.procs[pid] = p
				continue
			}
			// Exited (or the clock did not read): a zombie's clock gives its
			// final figure exactly (its stat's runs up to 2 ticks below);
			// its stat then tells a zombie (held as such) from one reaped
			// (its figure kept in done).
			if usec, ok := exitedClockUsec(pid, p.fd); ok {
				p.usec = max(p.usec, usec)
			}
			o.release(p.fd)
			p.fd, p.clock = -1, false
		}
		path := filepath.Join(o.procRoot, strconv.Itoa(pid), "stat")
		fd := -1
		var b []byte
		var err error
		if known && p.fd >= 0 {
			fd = p.fd
			b, err = preadStat(fd, path, o.buf[:])
		} else {
			fd, b, err = openStat(path, o.buf[:])
		}
		var t procTimes
		if err == nil {
			if t, err = parseProcStat(b); err != nil {
				err = fmt.Errorf("%s: %w", path, err)
			}
		}
		switch {
		case err != nil && process.IsGone(err):
			if known && p.ok {
				o.done += p.usec
			}
			o.release(fd)
			delete(o.procs, pid)
			continue
		case err != nil:
			if !known || fd != p.fd {
				o.release(fd)
			}
			errs = append(errs, fmt.Errorf("pid %d: %w", pid, err))
			continue
		}
		if known && p.start != t.Start {
			// A reused pid (read through a new descriptor: a held one
			// names the old process only): the old process is gone.
			if p.ok {
				o.done += p.usec
			}
			if p.fd >= 0 && p.fd == fd {
				o.held-- // not from the kernel (a held descriptor names one process); the fd is weighed anew below
			}
			delete(o.procs, pid) // counted in done now, not twice if the new one is not kept
			known = false
		}
		if !known {
			if t.State == 'Z' || t.State == 'X' {
				o.release(fd)
				continue // exited before it was checked: nothing to check it by
			}
			role := "runsc-gofer"
			if pid == sentry {
				role = "runsc-sandbox"
			}
			args, cerr := process.ReadCmdline(filepath.Join(o.procRoot, strconv.Itoa(pid)))
			if cerr != nil {
				o.release(fd)
				if !process.IsGone(cerr) {
					errs = append(errs, fmt.Errorf("pid %d: %w", pid, cerr))
				}
				continue
			}
			p = ownProc{start: t.Start, ok: len(args) > 0 && filepath.Base(args[0]) == role, fd: -1}
			why := ""
			if !p.ok {
				why = fmt.Sprintf("pid %d is not %s (argv[0] %s)", pid, role, foreign.Quote(firstArg(args)))
			}
			if argRoot := runscRootOf(args); p.ok && filepath.Clean(argRoot) != filepath.Clean(root) && !sameDir(argRoot, root) {
				// Not started with this root as written, nor with another
				// name of it here: a gofer in the sentry's cgroups, the
				// sentry in the bound cgroup or pinned, still is the
				// sandbox's.
				cg, _ := bounded.ReadFile(filepath.Join(o.procRoot, strconv.Itoa(pid), "cgroup"), bounded.MaxFileBytes)
				if pid == sentry {
					p.ok = o.pinnedAs(pid, t.Start) || len(cg) > 0 && cgroupNames(cg, o.cgroup)
					if !p.ok {
						why = fmt.Sprintf("the sentry (pid %d) runs with --root=%s, not %s, and neither its pin nor its cgroups say it is this sandbox's",
							pid, foreign.Quote(argRoot), foreign.Quote(root))
					}
				} else {
					if sentryCgroup == nil {
						sentryCgroup, _ = bounded.ReadFile(filepath.Join(o.procRoot, strconv.Itoa(sentry), "cgroup"), bounded.MaxFileBytes)
					}
					p.ok = len(cg) > 0 && bytes.Equal(cg, sentryCgroup)
				}
			}
			if pid == sentry {
				if p.ok {
					o.kvm, o.sentryStart = platformOf(args) == "kvm", t.Start
				} else {
					o.sentryWhy, o.whyStart = why, t.Start
				}
			}
		}
		p.usec = max(p.usec, t.Ticks*tickUsec)
		if fd != p.fd {
			if p.ok && p.fd < 0 && !o.closed && o.held < maxHeldStatFDs {
				p.fd = fd // held from now on: its clock when it reads by pid here, else the stat
				if pidfd, ok := holdClock(o.procRoot, pid, fd, t.State, o.buf[:]); ok {
					syscall.Close(fd)
					p.fd, p.clock = pidfd, true
					// Its clock from this first read on: the stat's two
					// truncated tick counts run up to 2 ticks behind it, and
					// a jump of the own figure between two samples would be
					// taken from the containers' next increase.
					if usec, live := clockUsec(pid, pidfd); live {
						p.usec = max(p.usec, usec)
					}
				}
				o.held++
			} else {
				o.release(fd)
			}
		}
		o.procs[pid] = p
	}
	var usec uint64
	for _, p := range o.procs {
		if p.ok {
			usec += p.usec
			out.Counts++
		}
	}
	out.Usec = o.done + usec
	if p, ok := o.procs[sentry]; ok && p.ok && p.start == o.sentryStart {
		out.KVM = o.kvm
	} else if ok && !p.ok && p.start == o.whyStart {
		out.SentryWhy = o.sentryWhy
	}
	o.snapshotLocked()
	return out, errors.Join(errs...)
}

// pinnedAs reports whether pid is the binding's pinned sentry, started at
// start.
func (o *ownTracker) pinnedAs(pid int, start uint64) bool {
	if o.pinned == nil {
		return false
	}
	ppid, pstart, ok := o.pinned()
	return ok && ppid == pid && pstart == start
}

// sameDir reports whether two paths name one directory here (a symlink, a
// bind mount): os.SameFile of both stats.
func sameDir(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// cgroupNames reports whether a /proc/<pid>/cgroup file names the cgroup
// bound (a line's path is it, or ends with it: the path as the launcher
// spelt it may be relative to a cgroup namespace).
func cgroupNames(file []byte, bound string) bool {
	if bound == "" {
		return false
	}
	want := path.Clean("/" + bound)
	for line := range strings.SplitSeq(string(file), "\n") {
		_, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, p, ok := strings.Cut(rest, ":")
		if !ok || p == "" {
			continue
		}
		p = path.Clean(p)
		if p == want || want != "/" && strings.HasSuffix(p, want) { // want begins with '/'
			return true
		}
	}
	return false
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// release closes fd unless it is -1 or held by a process (under o.mu).
func (o *ownTracker) release(fd int) {
	if fd < 0 {
		return
	}
	for pid, p := range o.procs {
		if p.fd == fd {
			p.fd, p.clock = -1, false
			o.procs[pid] = p
			o.held--
		}
	}
	syscall.Close(fd)
}

// close closes the held descriptors; later reads open and close their own.
// Safe to call more than once.
func (o *ownTracker) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for pid, p := range o.procs {
		if p.fd >= 0 {
			syscall.Close(p.fd)
			p.fd, p.clock = -1, false
			o.procs[pid] = p
		}
	}
	o.held = 0
}

// openStat opens a /proc/<pid>/stat and reads it (readStat's first read);
// the caller closes or holds the descriptor (-1 when the open failed).
func openStat(path string, buf []byte) (int, []byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	b, err := preadStat(fd, path, buf)
	return fd, b, err
}

// preadStat reads a /proc/<pid>/stat from its start into buf in one
// pread(2) (the kernel formats the whole line at once), without the
// runtime poller's registration an os.File costs. The caller bounds it (it
// runs inside the breakdown's bounded call).
func preadStat(fd int, path string, buf []byte) ([]byte, error) {
	var n int
	var err error
	for {
		n, err = syscall.Pread(fd, buf, 0)
		if err != syscall.EINTR {
			break
		}
	}
	switch {
	case err != nil:
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	case n == len(buf):
		return nil, fmt.Errorf("%w: %s: more than %d bytes", ErrProcStat, path, len(buf))
	}
	return buf[:n], nil
}

// platformOf returns runsc's --platform from a runsc command line ("" when
// not given).
func platformOf(args []string) string {
	for i, a := range args {
		for _, p := range []string{"--platform", "-platform"} {
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	return ""
}

// This file reads a checked own process's CPU from its process CPU clock
// (clock_gettime(2) on the clock of a pid, CPUCLOCK_SCHED): the
// nanoseconds the kernel charged all its threads, exited ones included,
// the same sum /proc/<pid>/stat's utime and stime are scaled to. The kernel
// sums the threads as for the stat line but formats nothing: about 0.4 µs
// a process here against 3 to 4 µs for a stat pread and its parse.
//
// A clock is named by a pid, which another process may take once this one
// is reaped, so the process is held as a pidfd: a read takes the clock,
// then polls the pidfd, and the figure is the process's only when it had
// not exited by then (its pid could not have been reused before). An
// exited process's final figure is its clock still while it is a zombie
// (exitedClockUsec); then it goes back to its stat (ownTracker.read),
// which tells a zombie from one reaped.

package gvisor

import (
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// holdClock returns a pidfd of the process whose stat statFD holds (pid in
// procRoot), when pid names that same process in statsd's own pid
// namespace, so that its clock can be read by pid: pidfd_open(pid) here,
// the pidfd's fdinfo read through procRoot naming pid there, and statFD
// still readable after both (the process was not reaped meanwhile, so no
// other took its pid). ok is false on any doubt (a kernel without pidfds,
// a /proc of another pid namespace, a zombie): the caller holds the stat.
func holdClock(procRoot string, pid, statFD int, state byte, buf []byte) (pidfd int, ok bool) {
	if state == 'Z' || state == 'X' {
		return -1, false
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, false
	}
	fdinfo, err := bounded.ReadFile(filepath.Join(procRoot, "self", "fdinfo", strconv.Itoa(pidfd)), maxFdinfoBytes)
	if err != nil || !fdinfoNames(fdinfo, pid) {
		syscall.Close(pidfd)
		return -1, false
	}
	if _, err := preadStat(statFD, "", buf); err != nil {
		syscall.Close(pidfd)
		return -1, false
	}
	return pidfd, true
}

// clockUsec returns the CPU of process pid (held as pidfd, holdClock) in
// µs; live is false when it has exited (or the clock did not
// read): the figure is then not its.
func clockUsec(pid, pidfd int) (usec uint64, live bool) {
	usec, ok := processClockUsec(pid)
	if !ok {
		return 0, false
	}
	// ppoll with a zero timeout never blocks: a raw system call, as the
	// clock's (Go's scheduler is not told of a wait that cannot happen).
	fds := [1]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	var zero unix.Timespec
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n != 0 {
			return 0, false // exited (readable), or the poll failed
		}
		break
	}
	return usec, true
}

// processClockUsec reads process pid's CPU clock, in µs.
func processClockUsec(pid int) (usec uint64, ok bool) {
	// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED): ~pid << 3 | 2.
	clk := int32(^pid<<3 | 2)
	var ts unix.Timespec
	if _, _, e := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, uintptr(clk), uintptr(unsafe.Pointer(&ts)), 0); e != 0 || ts.Sec < 0 {
		return 0, false
	}
	return uint64(ts.Sec)*1_000_000 + uint64(ts.Nsec)/1000, true
}

// exitedClockUsec returns the final CPU, in µs, of process pid, held as
// pidfd, which clockUsec found exited: a zombie's clock still reads (the
// kernel sums its threads as while it ran; clock_gettime fails with EINVAL
// once it is reaped), and exactly, where its /proc stat's two tick counts,
// each truncated, run up to 2 ticks (20 ms) below. The figure is the
// process's only if it was not reaped yet when the clock was read (its pid
// could be another's after): a signal 0 sent through the pidfd after the
// clock succeeds only while the process exists (ESRCH once reaped), so it
// existed, and held its pid, at the clock read before. ok is false
// otherwise (reaped, or it could not be told).
func exitedClockUsec(pid, pidfd int) (usec uint64, ok bool) {
	usec, ok = processClockUsec(pid)
	if !ok || unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		return 0, false
	}
	return usec, true
}

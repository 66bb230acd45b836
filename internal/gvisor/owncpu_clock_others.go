//go:build !linux

package gvisor

// holdClock: no process CPU clocks by pid here; the stat is held.
func holdClock(procRoot string, pid, statFD int, state byte, buf []byte) (int, bool) {
	return -1, false
}

// clockUsec is never called without a held clock.
func clockUsec(pid, pidfd int) (uint64, bool) { return 0, false }

// exitedClockUsec is never called without a held clock.
func exitedClockUsec(pid, pidfd int) (uint64, bool) { return 0, false }

//go:build !linux

package gvisor

// holdClock: no process CPU clocks by pid here; the stat is held.
func holdClock(procRoot string, pid, statFD int, state byte, buf []byte) (int, bool) {
	return -1, false
}

// clockTicks is never called without a held clock.
func clockTicks(pid, pidfd int) (uint64, bool) { return 0, false }

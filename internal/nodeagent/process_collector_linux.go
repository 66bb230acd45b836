package nodeagent

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// clockBootTime is the boot time as the kernel gives /proc/stat's btime:
// the wall clock less the time since boot (suspend included), in whole
// seconds.
func clockBootTime() (uint64, error) {
	var wall, boot unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &wall); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_REALTIME): %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_BOOTTIME): %w", err)
	}
	ns := wall.Nano() - boot.Nano()
	if ns < 0 {
		return 0, fmt.Errorf("boot time before the epoch: %d ns", ns)
	}
	return uint64(ns / 1e9), nil
}

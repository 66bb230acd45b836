//go:build !linux

package nodeagent

import "errors"

// clockBootTime: only Linux has CLOCK_BOOTTIME and /proc.
func clockBootTime() (uint64, error) {
	return 0, errors.New("no boot time outside Linux")
}

//go:build !linux

package gvisor

import (
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("gvisor: not supported on %s", runtime.GOOS)

// detectMode needs statfs; cgroups exist only on Linux. Set Config.Mode to
// read fixture trees elsewhere.
func detectMode(string) (Mode, error) { return ModeAuto, errUnsupported }

// mountID needs statx: the mount is then found by its mount point.
func mountID(string) (int, bool) { return 0, false }

//go:build !linux

package hoststat

import (
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("hoststat: debugfs not supported on %s", runtime.GOOS)

func isDebugfs(string) (bool, error) { return false, errUnsupported }

func inPrivateDebugfs(string, func()) error { return errUnsupported }

//go:build !linux

package exepages

import (
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("exepages: not supported on %s", runtime.GOOS)

func exeFile(string) (file, error) { return file{}, errUnsupported }

func dontNeed(span) error { return errUnsupported }

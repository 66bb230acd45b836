//go:build !linux

package sentryusage

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"time"
)

// errUnsupported: gVisor runs on Linux only.
var errUnsupported = fmt.Errorf("sentryusage: not supported on %s", runtime.GOOS)

func dialUnix(context.Context, time.Time, string) (net.Conn, error) { return nil, errUnsupported }

func unasked(net.Conn) error { return errUnsupported }

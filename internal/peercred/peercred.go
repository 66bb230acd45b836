package peercred

import (
	"errors"
	"fmt"
	"runtime"
)

// ErrUnsupported is returned where the platform offers no peer credentials.
var ErrUnsupported = fmt.Errorf("peercred: not supported on %s", runtime.GOOS)

// ErrNotUnix is returned for a connection that is not a Unix socket.
var ErrNotUnix = errors.New("peercred: not a Unix socket connection")

//go:build !linux

package peercred

import (
	"fmt"
	"net"
	"runtime"
)

var errUnsupported = fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOOS)

// Of returns ErrUnsupported: there is no SO_PEERCRED here, so a Listener
// refuses every peer.
func Of(net.Conn) (Cred, error) { return Cred{}, errUnsupported }

func groupsOf(string, int32) ([]uint32, error) { return nil, errUnsupported }

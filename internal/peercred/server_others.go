//go:build !linux

package peercred

import "net"

// of returns ErrUnsupported: there is no SO_PEERCRED here, so a Listener
// refuses every peer.
func of(net.Conn) (Cred, error) { return Cred{}, ErrUnsupported }

func groupsOf(string, int32) ([]uint32, error) { return nil, ErrUnsupported }

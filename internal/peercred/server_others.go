//go:build !linux

package peercred

import "net"

// Of returns ErrUnsupported: there is no SO_PEERCRED here, so a Listener
// refuses every peer.
func Of(net.Conn) (Cred, error) { return Cred{}, ErrUnsupported }

func groupsOf(string, int32) ([]uint32, error) { return nil, ErrUnsupported }

//go:build !linux

package peercred

import "net"

// PeerUID returns ErrUnsupported: only Linux is supported.
func PeerUID(net.Conn) (uid, gid uint32, err error) { return 0, 0, ErrUnsupported }

package peercred

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerUID returns the uid and gid of the process at the other end of conn,
// a Unix socket connection, as the kernel recorded them when that process
// called connect(2) or listen(2) (SO_PEERCRED: its effective ids then).
func PeerUID(conn net.Conn) (uid, gid uint32, err error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, 0, ErrNotUnix
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("peercred: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, fmt.Errorf("peercred: %w", err)
	}
	if serr != nil {
		return 0, 0, fmt.Errorf("peercred: SO_PEERCRED: %w", serr)
	}
	return cred.Uid, cred.Gid, nil
}

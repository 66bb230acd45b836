package peercred

import "net"

// PeerUID returns the uid and gid of the process at the other end of conn,
// a Unix socket connection, as the kernel recorded them when that process
// called connect(2) or listen(2) (SO_PEERCRED: its effective ids then).
func PeerUID(conn net.Conn) (uid, gid uint32, err error) {
	if _, ok := conn.(*net.UnixConn); !ok {
		return 0, 0, ErrNotUnix
	}
	c, err := of(conn)
	if err != nil {
		return 0, 0, err
	}
	return c.UID, c.GID, nil
}

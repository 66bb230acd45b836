package peercred

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Of returns the credentials of the peer of a Unix connection, with its
// pid (PeerUID gives the ids alone).
func Of(c net.Conn) (Cred, error) {
	uc, ok := c.(syscall.Conn)
	if !ok {
		return Cred{}, fmt.Errorf("%w: %T", ErrNotUnix, c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peercred: %w", err)
	}
	var (
		u    *unix.Ucred
		uerr error
	)
	if err := raw.Control(func(fd uintptr) { u, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return Cred{}, fmt.Errorf("peercred: %w", err)
	}
	if uerr != nil {
		return Cred{}, fmt.Errorf("peercred: SO_PEERCRED: %w", uerr)
	}
	return Cred{PID: u.Pid, UID: u.Uid, GID: u.Gid}, nil
}

// groupsOf reads the supplementary groups of pid (the Groups: line of
// <procRoot>/<pid>/status).
func groupsOf(procRoot string, pid int32) ([]uint32, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "status"))
	if err != nil {
		return nil, err
	}
	return parseGroups(b)
}

package peercred

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// of returns the credentials of the peer of a Unix connection, with its
// pid (PeerUID gives the ids alone).
func of(c net.Conn) (Cred, error) {
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

// maxStatusBytes bounds the read of a status file. The kernel's longest,
// with NGROUPS_MAX (65536) supplementary groups of up to 10 digits each,
// is under 1 MiB.
const maxStatusBytes = 1 << 20

// groupsOf reads the supplementary groups of pid (the Groups: line of
// <procRoot>/<pid>/status), reading at most maxStatusBytes: a longer file
// is an error, never a Groups line cut short (a cut id could be another).
func groupsOf(procRoot string, pid int32) ([]uint32, error) {
	return readGroups(filepath.Join(procRoot, strconv.Itoa(int(pid)), "status"), maxStatusBytes)
}

func readGroups(path string, limit int64) ([]uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("peercred: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("peercred: %s: over %d bytes", path, limit)
	}
	return parseGroups(b)
}

package main

// This file makes statsd's Unix sockets: the file (mode, group, stale-socket
// replacement, removal only of its own), who is served on each (peer
// credentials), and how many connections the read socket serves at once.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/connlimit"
)

// listenUnix listens on a Unix socket at path with the given mode (and
// group, unless gid is -1), creating its directory with dirMode if missing.
// A stale socket file (connection refused: nobody listens) is replaced; any
// other answer means it may be live and is an error. The returned cleanup
// removes the file only if it is still the one this process created.
func listenUnix(path string, dirMode, mode os.FileMode, gid int) (*net.UnixListener, func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, nil, fmt.Errorf("listen %s: another process is serving on it", path)
		case !errors.Is(err, syscall.ECONNREFUSED):
			return nil, nil, fmt.Errorf("listen %s: cannot tell whether the socket is live, leaving it: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	// The socket is created with 0777 minus the umask and narrowed by Chmod
	// below; a restrictive umask closes that window.
	old := syscall.Umask(0o077)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ul := lis.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // removed below, only if still ours
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			lis.Close()
			return nil, nil, fmt.Errorf("listen %s: chown to group %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("listen %s: chmod: %w", path, err)
	}
	created, err := os.Lstat(path)
	if err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	cleanup := func() {
		lis.Close()
		// Same inode and same change time: inode numbers are reused, so a
		// socket made later by someone else can share ours.
		if now, err := os.Lstat(path); err == nil && os.SameFile(now, created) && now.ModTime().Equal(created.ModTime()) {
			os.Remove(path)
		}
	}
	return ul, cleanup, nil
}

// lookupGroup resolves --socket-group: a gid or a group name.
func lookupGroup(s string) (int, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return int(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("--socket-group %q: %w", s, err)
	}
	n, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("--socket-group %q: gid %q: %w", s, g.Gid, err)
	}
	return n, nil
}

// socketGID is the group of the socket file at path.
func socketGID(path string) (uint32, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("no owner information")
	}
	return st.Gid, nil
}

// connCap is the number of read connections served at once: the flag's,
// lowered so that at least a quarter of the descriptor limit (and at least
// 64) stays for the lifecycle socket, the state files and the sources' own
// reads.
func connCap(want int) (int, uint64) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return want, 0
	}
	reserve := max(rl.Cur/4, 64)
	if rl.Cur <= reserve {
		return 1, rl.Cur
	}
	return int(min(uint64(want), rl.Cur-reserve)), rl.Cur
}

// newCapListener serves at most max read connections at once: one more is
// closed as soon as it is accepted (the peer sees EOF, not a hang), counted,
// and logged at most once per 10 s.
func newCapListener(l net.Listener, max int, log *slog.Logger) *connlimit.Listener {
	return connlimit.NewListener(l, max, log, "read connection refused: as many as --max-read-connections are open")
}

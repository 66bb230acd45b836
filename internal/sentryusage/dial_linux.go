package sentryusage

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// unixPathMax is sizeof(sockaddr_un.sun_path).
const unixPathMax = 108

// dialUnix connects to a Unix stream socket: a path, or an abstract name
// written @name. A path too long for sun_path is opened O_PATH and
// connected through /proc/self/fd/N, as runsc's own sandboxConnect does.
func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if !strings.HasPrefix(addr, "@") && len(addr) >= unixPathMax {
		fd, err := unix.Open(addr, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: addr, Err: err}
		}
		defer unix.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	return d.DialContext(ctx, "unix", addr)
}

// errUnasked: bytes from the sentry while no call was in flight.
var errUnasked = errors.New("bytes sent unasked")

// unasked checks a kept connection before a request is written on it: nil
// when nothing is readable (no byte, not closed), io.EOF when the sentry
// closed it, errUnasked when it sent bytes nobody asked for. It peeks
// without blocking and consumes nothing.
func unasked(conn net.Conn) error {
	sc, ok := conn.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var rerr error
	var b [1]byte
	// Control, not Read: the connection's deadline (the last Read's) has
	// passed, and Read would return at once.
	if err := rc.Control(func(fd uintptr) {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	}); err != nil {
		return err
	}
	switch {
	case errors.Is(rerr, unix.EAGAIN):
		return nil
	case rerr != nil:
		return rerr
	case n == 0:
		return io.EOF
	}
	return errUnasked
}

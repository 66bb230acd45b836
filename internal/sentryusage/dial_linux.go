package sentryusage

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// unixPathMax is sizeof(sockaddr_un.sun_path).
const unixPathMax = 108

// dialUnix connects to a Unix stream socket: a path, or an abstract name
// written @name. A path too long for sun_path is opened O_PATH and
// connected through /proc/self/fd/N, as runsc's own sandboxConnect does.
//
// The connection is a rawConn: a non-blocking socket that the Go
// netpoller never sees (no epoll registration, no getsockname and
// getpeername, none of net's bookkeeping), waited on with poll(2) only
// when it is not ready. At a 10 s polling interval every read dials (the
// connection is kept 2 s), and net.Dial's system calls were most of a
// dial's cost on a VM where one costs 5 to 10 µs. The connect is bounded
// by dl and ctx (a full backlog is retried until either is done: the error
// is then os.ErrDeadlineExceeded or ctx's); reads and writes by the
// connection's deadline.
func dialUnix(ctx context.Context, dl time.Time, addr string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !time.Now().Before(dl) {
		return nil, os.ErrDeadlineExceeded
	}
	sa := &unix.SockaddrUnix{Name: addr}
	if !strings.HasPrefix(addr, "@") && len(addr) >= unixPathMax {
		fd, err := unix.Open(addr, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: addr, Err: err}
		}
		defer unix.Close(fd)
		sa.Name = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	for {
		err = unix.Connect(fd, sa)
		if err == nil || err == unix.EISCONN {
			break
		}
		if err == unix.EINTR {
			continue
		}
		if err != unix.EAGAIN {
			unix.Close(fd)
			return nil, os.NewSyscallError("connect", err)
		}
		// The listener's backlog is full (a sentry that does not
		// accept): again shortly, until dl or ctx is done.
		left := time.Until(dl)
		if left <= 0 {
			unix.Close(fd)
			return nil, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(min(time.Millisecond, left))
		select {
		case <-ctx.Done():
			t.Stop()
			unix.Close(fd)
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return &rawConn{fd: fd, addr: addr}, nil
}

// A rawConn is a connected non-blocking Unix stream socket outside the Go
// netpoller. Read and Write try the system call first and poll(2) for
// readiness, up to the deadline, only when it would block: a goroutine
// waiting holds its thread (a sentry that hangs holds one thread per
// sandbox for at most the Read's bound). A deadline set in the past
// (context.AfterFunc's cancellation in Client.call, from another
// goroutine) shuts the socket down, which wakes a poll in progress; the
// connection is not used again after that. Close may be called once the
// Read and Write in progress have returned (or concurrently with a past
// deadline).
type rawConn struct {
	addr     string
	deadline atomic.Int64 // unix ns; 0: none

	mu sync.Mutex // guards fd against Close while a past deadline shuts it down
	fd int        // -1 once closed
}

var _ net.Conn = (*rawConn)(nil)

func (c *rawConn) Read(p []byte) (int, error) {
	for {
		if err := c.expired(); err != nil {
			return 0, err
		}
		n, err := unix.Read(c.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := c.wait(unix.POLLIN); err != nil {
				return 0, err
			}
			continue
		case err != nil:
			return 0, c.opError("read", err)
		case n == 0 && len(p) > 0:
			if err := c.expired(); err != nil {
				return 0, err // shut down by a past deadline
			}
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *rawConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if err := c.expired(); err != nil {
			return done, err
		}
		n, err := unix.SendmsgN(c.fd, p[done:], nil, nil, unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := c.wait(unix.POLLOUT); err != nil {
				return done, err
			}
			continue
		case err != nil:
			if xerr := c.expired(); xerr != nil {
				return done, xerr
			}
			return done, c.opError("write", err)
		}
		done += n
	}
	return done, nil
}

// expired is os.ErrDeadlineExceeded once the deadline has passed.
func (c *rawConn) expired() error {
	if d := c.deadline.Load(); d != 0 && time.Now().UnixNano() >= d {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// wait polls for events until the deadline; the caller tries again.
func (c *rawConn) wait(events int16) error {
	for {
		ms := -1
		if d := c.deadline.Load(); d != 0 {
			left := time.Duration(d - time.Now().UnixNano())
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			ms = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: events}}
		n, err := unix.Poll(fds, ms)
		switch {
		case err == unix.EINTR || err == nil && n == 0:
			continue // the deadline is checked again
		case err != nil:
			return c.opError("poll", err)
		}
		return nil // ready, or an error or hang-up the call itself reports
	}
}

func (c *rawConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "unix", Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}

func (c *rawConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// SetDeadline sets the deadline of reads and writes; one in the past also
// shuts the socket down, waking a Read or Write that waits.
func (c *rawConn) SetDeadline(t time.Time) error {
	if t.IsZero() {
		c.deadline.Store(0)
		return nil
	}
	c.deadline.Store(t.UnixNano())
	if !t.After(time.Now()) {
		c.mu.Lock()
		if c.fd >= 0 {
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
		c.mu.Unlock()
	}
	return nil
}

// SetReadDeadline and SetWriteDeadline set the one deadline.
func (c *rawConn) SetReadDeadline(t time.Time) error  { return c.SetDeadline(t) }
func (c *rawConn) SetWriteDeadline(t time.Time) error { return c.SetDeadline(t) }

func (c *rawConn) LocalAddr() net.Addr  { return &net.UnixAddr{Net: "unix"} }
func (c *rawConn) RemoteAddr() net.Addr { return &net.UnixAddr{Name: c.addr, Net: "unix"} }

// errUnasked: bytes from the sentry while no call was in flight.
var errUnasked = errors.New("bytes sent unasked")

// unasked checks a kept connection before a request is written on it: nil
// when nothing is readable (no byte, not closed), io.EOF when the sentry
// closed it, errUnasked when it sent bytes nobody asked for. It peeks
// without blocking and consumes nothing.
func unasked(conn net.Conn) error {
	var n int
	var rerr error
	var b [1]byte
	if rc, ok := conn.(*rawConn); ok {
		n, _, rerr = unix.Recvfrom(rc.fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	} else {
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
		// Control, not Read: the connection's deadline (the last Read's) has
		// passed, and Read would return at once.
		if err := rc.Control(func(fd uintptr) {
			n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		}); err != nil {
			return err
		}
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

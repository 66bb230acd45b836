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
	"time"

	"golang.org/x/sys/unix"
)

// unixPathMax is sizeof(sockaddr_un.sun_path).
const unixPathMax = 108

// dialUnix connects to a Unix stream socket: a path, or an abstract name
// written @name. A path too long for sun_path is opened O_PATH and
// connected through /proc/self/fd/N, as runsc's own sandboxConnect does.
//
// It makes the socket itself (socket and connect, non-blocking: a full
// backlog is EAGAIN at once, as net.Dial's) and hands it to Go's netpoller
// as an *os.File: a read or write that must wait parks its goroutine, not a
// thread, and the deadlines work as a net.Conn's. net.Dial's getsockname,
// getpeername and address values are what it saves (two system calls and
// about 2 µs of allocation a dial; a dial a read at a 10 s interval).
func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	raddr := &net.UnixAddr{Name: addr, Net: "unix"}
	fail := func(op string, err error) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: raddr, Err: os.NewSyscallError(op, err)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: raddr, Err: err}
	}
	name := addr
	if !strings.HasPrefix(addr, "@") && len(addr) >= unixPathMax {
		fd, err := unix.Open(addr, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: addr, Err: err}
		}
		defer unix.Close(fd)
		name = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket", err)
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: name})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil && err != syscall.EISCONN { // EISCONN: an interrupted connect that completed
		syscall.Close(fd)
		return fail("connect", err)
	}
	f := os.NewFile(uintptr(fd), printable(addr)) // non-blocking: registered with the netpoller
	return &fileConn{f: f, raddr: raddr}, nil
}

// fileConn is a connected socket as an *os.File (its Read, Write, Close,
// deadlines and SyscallConn: those of Go's netpoller, and a finalizer that
// closes a lost one), with net.Conn's addresses. The file is not embedded:
// its Fd would put the socket back in blocking mode, and a wait would then
// hold a thread and ignore the deadlines.
type fileConn struct {
	f     *os.File
	raddr *net.UnixAddr
}

func (c *fileConn) Read(b []byte) (int, error)         { return c.f.Read(b) }
func (c *fileConn) Write(b []byte) (int, error)        { return c.f.Write(b) }
func (c *fileConn) Close() error                       { return c.f.Close() }
func (c *fileConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *fileConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *fileConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }
func (c *fileConn) SyscallConn() (syscall.RawConn, error) {
	return c.f.SyscallConn()
}
func (c *fileConn) LocalAddr() net.Addr  { return &net.UnixAddr{Net: "unix"} }
func (c *fileConn) RemoteAddr() net.Addr { return c.raddr }

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

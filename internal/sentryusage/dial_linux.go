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
	"unsafe"

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
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fail("socket", err)
	}
	return &fileConn{f: f, rc: rc, raddr: raddr}, nil
}

// fileConn is a connected socket as an *os.File (its Read, Write, Close,
// deadlines and SyscallConn: those of Go's netpoller, and a finalizer that
// closes a lost one), with net.Conn's addresses. The file is not embedded:
// its Fd would put the socket back in blocking mode, and a wait would then
// hold a thread and ignore the deadlines.
//
// Read and Write make their read(2) and write(2) as raw system calls inside
// the netpoller's wait (RawConn): the socket is non-blocking, so neither
// can block (EAGAIN: the goroutine parks, bounded by the deadline, as
// os.File's). A plain system call tells Go's scheduler the thread may
// block: the request's write wakes the sentry, which the kernel often runs
// on this thread's CPU at once, and Go then counted the preempted write as
// a blocked system call, handed the P to another thread and woke sysmon
// (about 2.5 extra context switches a read, measured with perf).
type fileConn struct {
	f     *os.File
	rc    syscall.RawConn
	raddr *net.UnixAddr
}

func (c *fileConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // park until readable or the deadline
			}
			n, errno = int(r), e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err // the deadline, or closed: os.File's *PathError
	case errno != 0:
		return 0, &os.PathError{Op: "read", Path: c.f.Name(), Err: errno}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *fileConn) Write(b []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[n])), uintptr(len(b)-n))
			switch e {
			case 0:
				n += int(r)
				continue
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // park until writable or the deadline
			}
			errno = e
			return true
		}
		return true
	})
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, &os.PathError{Op: "write", Path: c.f.Name(), Err: errno}
	}
	return n, nil
}

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

package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/mdlayher/vsock"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// ErrHandshake is wrapped by every hybrid-vsock handshake failure.
var ErrHandshake = errors.New("microvm: hybrid vsock handshake failed")

// VsockDialFunc opens an AF_VSOCK stream to cid:port. The default is
// github.com/mdlayher/vsock; tests inject another (on the host this
// project's tests never create an AF_VSOCK socket; inside the VM lane's guest
// TestIntegrationVsockLoopback's dialer calls dialVsock with the loopback
// CID).
type VsockDialFunc func(ctx context.Context, cid, port uint32) (net.Conn, error)

func dialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	return vsock.DialContext(ctx, cid, port, nil)
}

// maxHandshakeLine bounds the reply to CONNECT; "OK 4294967295\n" is 14 bytes.
const maxHandshakeLine = 64

// dial opens a byte stream to the agent at addr that speaks ttrpc from its
// first byte: for hybrid vsock it connects the Unix socket and performs the
// CONNECT handshake. ctx bounds the whole dial.
func dial(ctx context.Context, addr Address, dialVsockFn VsockDialFunc) (net.Conn, error) {
	switch addr.Scheme {
	case SchemeHybridVsock:
		return dialHybrid(ctx, addr.Path, addr.Port)
	case SchemeVsock:
		if dialVsockFn == nil {
			dialVsockFn = dialVsock
		}
		conn, err := dialVsockFn(ctx, addr.CID, addr.Port)
		if err != nil {
			return nil, fmt.Errorf("%w: dial %s: %w", dialSentinel(ctx, err), addr, err)
		}
		return conn, nil
	default:
		return nil, fmt.Errorf("%w: %v", ErrAddress, addr)
	}
}

// dialHybrid connects the VMM's hybrid-vsock Unix socket and asks it to
// forward to guest port: it writes "CONNECT <port>\n" and accepts only an
// "OK <host port>\n" line, read within ctx's deadline. From the next byte on
// the stream belongs to the agent.
func dialHybrid(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: connect hybrid vsock socket %s: %w", dialSentinel(ctx, err), path, err)
	}
	if err := handshake(ctx, conn, port); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s port %d: %w", path, port, err)
	}
	return conn, nil
}

// handshake performs the client side of the hybrid-vsock CONNECT exchange
// on conn under ctx's deadline, then clears the deadline.
func handshake(ctx context.Context, conn net.Conn, port uint32) error {
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return fmt.Errorf("%w: set deadline: %w", source.ErrNotMeasurable, err)
		}
	}
	// A cancel without a deadline still has to unblock the read.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return fmt.Errorf("%w: %w: write CONNECT: %w", dialSentinel(ctx, err), ErrHandshake, err)
	}
	line, err := readLine(conn, maxHandshakeLine)
	if err != nil {
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return fmt.Errorf("%w: %w: the VMM closed the connection after CONNECT (read %s): nothing listens on the guest port (agent not up yet?)",
				source.ErrNotMeasurable, ErrHandshake, foreign.QuoteBytes(line))
		case errors.Is(err, errLineTooLong):
			return fmt.Errorf("%w: %w: reply %s...: %w", source.ErrMalformed, ErrHandshake, foreign.QuoteBytes(line), err)
		default:
			return fmt.Errorf("%w: %w: read reply (got %s): %w", dialSentinel(ctx, err), ErrHandshake, foreign.QuoteBytes(line), err)
		}
	}
	if _, err := parseHandshakeLine(line); err != nil {
		return fmt.Errorf("%w: %w", source.ErrMalformed, err)
	}
	if testHookHandshakeReplied != nil {
		testHookHandshakeReplied()
	}
	// Stop the AfterFunc before clearing the deadline: if ctx ended in
	// between, the AfterFunc would set a past deadline on the connection
	// after it was cleared and the first ttrpc read would fail. If it has
	// run or is running, the dial ran out of time.
	if !stop() {
		return fmt.Errorf("%w: %w: out of time as the reply arrived: %w", source.ErrTimeout, ErrHandshake, ctx.Err())
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("%w: clear deadline: %w", source.ErrNotMeasurable, err)
	}
	return nil
}

// testHookHandshakeReplied, if set (tests only), runs in handshake after a
// valid reply was read and before the deadline is cleared.
var testHookHandshakeReplied func()

var errLineTooLong = errors.New("no newline within the line limit")

// readLine reads up to and including the first '\n', one byte at a time so
// that nothing after the line (the agent's first ttrpc bytes) is consumed.
func readLine(r io.Reader, max int) ([]byte, error) {
	line := make([]byte, 0, 16)
	var b [1]byte
	for len(line) < max {
		n, err := r.Read(b[:])
		if n == 1 {
			line = append(line, b[0])
			if b[0] == '\n' {
				return line, nil
			}
			continue
		}
		if err != nil {
			return line, err
		}
	}
	return line, errLineTooLong
}

// parseHandshakeLine reads the VMM's answer to CONNECT, newline included. It
// accepts exactly "OK <decimal host port>\n" and returns the host port.
func parseHandshakeLine(line []byte) (uint32, error) {
	rest, ok := bytes.CutPrefix(line, []byte("OK "))
	if !ok {
		return 0, fmt.Errorf("%w: reply %s does not start with \"OK \"", ErrHandshake, foreign.QuoteBytes(line))
	}
	rest, ok = bytes.CutSuffix(rest, []byte("\n"))
	if !ok {
		return 0, fmt.Errorf("%w: reply %s does not end with a newline", ErrHandshake, foreign.QuoteBytes(line))
	}
	hostPort, err := parseDecimalUint32(string(rest))
	if err != nil {
		return 0, fmt.Errorf("%w: reply %s: host port %s: %w", ErrHandshake, foreign.QuoteBytes(line), foreign.QuoteBytes(rest), err)
	}
	return hostPort, nil
}

// dialSentinel classifies a dial or handshake I/O error: out of time is
// ErrTimeout, anything else (no socket, refused, reset) ErrNotMeasurable.
func dialSentinel(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return source.ErrTimeout
	}
	return source.ErrNotMeasurable
}

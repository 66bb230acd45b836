package sentryusage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	// DefaultTimeout bounds one Read: every dial, the request and the
	// reply. runsc events takes about 40 ms here, mostly its own start.
	DefaultTimeout = 2 * time.Second
	// DefaultMaxReplyBytes caps a reply: release-20221219's is 344 bytes
	// for three containers, later ones add network interfaces.
	DefaultMaxReplyBytes = 64 << 10
	// DefaultKeepFor is how long a Session keeps a connection after
	// dialling it. It bounds what a kept connection can hold up: a sentry
	// whose root container has exited waits for its control clients (up to
	// runsc's --control-rpc-stop-timeout, 15 s) before it exits, and `runsc
	// wait` on that container with it (pkg/urpc/urpc.go Server.Stop).
	DefaultKeepFor = 2 * time.Second
	// maxDialects bounds the per-socket dialect memo.
	maxDialects = 4096
)

// Config configures a Client. The zero value with a root dir is usable.
type Config struct {
	// RootDirs are runsc root directories (--root) to find
	// runsc-<sandbox id>.sock in, in order: runsc itself tries its --root,
	// then /var/run, /run and /tmp. Under containerd's runsc shim the root
	// is /run/containerd/runsc/<namespace>.
	RootDirs []string
	// Abstract also tries the abstract socket @runsc-sandbox.<sandbox id>
	// (runsc up to release-20230123, and a fallback until
	// release-20230920), after the root dirs. Abstract sockets have no file
	// permissions and belong to the caller's network namespace.
	Abstract bool
	// Timeout bounds one Read; 0 means DefaultTimeout. A context deadline
	// that comes sooner wins.
	Timeout time.Duration
	// MaxReplyBytes caps one reply; 0 means DefaultMaxReplyBytes.
	MaxReplyBytes int
	// KeepFor is how long a Session keeps a connection after dialling it;
	// 0 means DefaultKeepFor. Client.Read keeps none.
	KeepFor time.Duration
}

// Query names what to read.
type Query struct {
	// SandboxID names the control socket: the sandbox's (root, pause)
	// container id.
	SandboxID string
	// ContainerID is the container memory and pids are asked for; CPU
	// comes for every container either way.
	ContainerID string
	// Containers, when not empty, are the ids (or names, see Usage.CPU) the
	// caller knows in this sandbox (from runsc's state files): any other
	// key of the reply is left out of Usage.CPU and counted in
	// Usage.Foreign.
	Containers []string
}

// Client reads usage from sentries' control servers. It is safe for
// concurrent use. Client.Read keeps no connection open between Reads, only
// what argument form each socket accepted; a Session (Client.Session) keeps
// one.
type Client struct {
	roots    []string
	abstract bool
	timeout  time.Duration
	maxReply int
	keepFor  time.Duration

	mu       sync.Mutex
	dialects map[string]Dialect // by socket address
}

// New returns a Client, or an error when cfg names no place to look or a
// negative bound.
func New(cfg Config) (*Client, error) {
	if len(cfg.RootDirs) == 0 && !cfg.Abstract {
		return nil, errors.New("sentryusage: no root dir and no abstract socket: nowhere to find a control socket")
	}
	if cfg.Timeout < 0 || cfg.MaxReplyBytes < 0 || cfg.KeepFor < 0 {
		return nil, fmt.Errorf("sentryusage: negative Timeout (%v), MaxReplyBytes (%d) or KeepFor (%v)", cfg.Timeout, cfg.MaxReplyBytes, cfg.KeepFor)
	}
	c := &Client{abstract: cfg.Abstract, timeout: cfg.Timeout, maxReply: cfg.MaxReplyBytes, keepFor: cfg.KeepFor, dialects: map[string]Dialect{}}
	for _, r := range cfg.RootDirs {
		if r == "" {
			return nil, errors.New("sentryusage: an empty root dir")
		}
		c.roots = append(c.roots, filepath.Clean(r))
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxReply == 0 {
		c.maxReply = DefaultMaxReplyBytes
	}
	if c.keepFor == 0 {
		c.keepFor = DefaultKeepFor
	}
	return c, nil
}

// Read asks the sentry of q.SandboxID for q.ContainerID's usage: one
// connection, one request (two on a socket's first Read when the first
// argument form is refused), one bounded reply. Errors wrap one of the
// package's sentinels and name the socket and the container.
func (c *Client) Read(ctx context.Context, q Query) (Usage, error) {
	return c.read(ctx, q, nil)
}

// read is Read, on s's kept connection when s is not nil and holds one for
// q.SandboxID.
func (c *Client) read(ctx context.Context, q Query, s *Session) (Usage, error) {
	if err := validID(q.SandboxID); err != nil {
		return Usage{}, fmt.Errorf("%w: sandbox id %q: %w", ErrBadID, cutID(q.SandboxID), err)
	}
	if err := validID(q.ContainerID); err != nil {
		return Usage{}, fmt.Errorf("%w: container id %q: %w", ErrBadID, cutID(q.ContainerID), err)
	}
	// The bound as a deadline on the connection (and a context only
	// for a dial): a context with a timer of its own at every Read cost
	// more than the rest of a Read on a kept connection but the I/O.
	dl := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	var dctx context.Context // made at the first dial of this Read
	var cancel context.CancelFunc
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()
	dialCtx := func() context.Context {
		if dctx == nil {
			dctx, cancel = context.WithDeadline(ctx, dl)
		}
		return dctx
	}
	kc := s.take(q.SandboxID)
	if kc != nil && unasked(kc.conn) != nil {
		// The sentry closed it, or sent bytes nobody asked for (a
		// hostile or confused peer: they must not be read as the next
		// reply): dial anew.
		kc.close()
		kc = nil
	}
	reused := kc != nil
	if kc == nil {
		conn, addr, err := c.dial(dialCtx(), q.SandboxID)
		if err != nil && dctx.Err() != nil {
			return Usage{}, c.wireError(dctx, "(sandbox "+q.SandboxID+")", q.ContainerID, "dial", err)
		}
		if err != nil {
			tried := c.candidates(q.SandboxID)
			for i := range tried {
				tried[i] = printable(tried[i])
			}
			return Usage{}, errorf(ErrNoSocket, "(sandbox "+q.SandboxID+")", q.ContainerID, "tried "+strings.Join(tried, ", "), err)
		}
		kc = s.wrap(conn, q.SandboxID, addr)
	}
	addr := kc.addr
	d, first := c.dialect(addr)
	if first {
		d = DialectContainerID
		if strings.HasPrefix(addr, "@") {
			d = DialectNoArg // an abstract socket is runsc before release-20230920: likely the old form
		}
	}
	u, keep, err := c.call(ctx, dl, kc.conn, addr, d, q)
	if err != nil && reused && errors.Is(err, errStale) {
		// A kept connection the sentry closed (or reset) before
		// answering: the one dial of this Read, within its deadline.
		// Event reads and changes nothing: asking again is harmless.
		kc.close()
		conn, derr := c.dialAddr(dialCtx(), addr)
		if derr != nil {
			return Usage{}, c.wireError(dctx, printable(addr), q.ContainerID, "dial again (kept connection closed: "+err.Error()+")", derr)
		}
		kc = s.wrap(conn, q.SandboxID, addr)
		u, keep, err = c.call(ctx, dl, kc.conn, addr, d, q)
	}
	if err != nil && (wantsNoArg(err) && d == DialectContainerID || first && d == DialectNoArg && errors.Is(err, ErrRemote)) {
		// The other argument form, once, on a new connection (urpc
		// serves several calls per connection, but a fresh one leaves
		// nothing of the refused call behind).
		kc.close()
		d = DialectNoArg + DialectContainerID - d
		conn, derr := c.dialAddr(dialCtx(), addr)
		if derr != nil {
			return Usage{}, errorf(ErrIO, addr, q.ContainerID, "dial again", derr)
		}
		kc = s.wrap(conn, q.SandboxID, addr)
		u, keep, err = c.call(ctx, dl, kc.conn, addr, d, q)
	}
	if err != nil {
		kc.close() // whatever went wrong, the framing is not trusted again
		return Usage{}, err
	}
	c.learn(addr, d)
	if keep {
		s.put(kc)
	} else {
		kc.close()
	}
	u.Socket = printable(addr)
	return u, nil
}

// errStale marks an error of call that says the connection was closed or
// reset by the sentry before a byte of the reply came.
var errStale = errors.New("connection closed before the reply")

// call sends one request on conn, reads one bounded reply and parses it,
// by the deadline dl (or until ctx is done). It leaves conn open; keep says
// that nothing but the reply came and the deadline did not fire, so that
// conn can carry another call.
func (c *Client) call(ctx context.Context, dl time.Time, conn net.Conn, addr string, d Dialect, q Query) (u Usage, keep bool, err error) {
	where := printable(addr)
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			keep = false // the deadline may be set in the past at any time now
		}
	}()

	if _, err := conn.Write(encodeRequest(d, q.ContainerID)); err != nil {
		return Usage{}, false, c.staleError(ctx, where, q.ContainerID, "write request", err)
	}
	rep, trailing, err := decodeReplyFast(conn, c.maxReply)
	if err != nil {
		var re *replyError
		if errors.As(err, &re) {
			return Usage{}, false, errorf(re.sentinel, where, q.ContainerID, re.what, re.cause)
		}
		return Usage{}, false, c.staleError(ctx, where, q.ContainerID, "read reply", err)
	}
	u, err = checkReply(rep, d, q)
	if err != nil {
		re := err.(*replyError)
		return Usage{}, false, errorf(re.sentinel, where, q.ContainerID, re.what, re.cause)
	}
	return u, !trailing, nil
}

// staleError is wireError, marked errStale when err says the sentry closed
// or reset the connection before any byte of the reply.
func (c *Client) staleError(ctx context.Context, where, container, what string, err error) error {
	werr := c.wireError(ctx, where, container, what, err)
	if ctx.Err() == nil && (errors.Is(err, errClosedEmpty) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		return fmt.Errorf("%w (%w)", werr, errStale)
	}
	return werr
}

// errClosedEmpty is decodeReply's error for a connection closed before the
// reply's first byte.
var errClosedEmpty = fmt.Errorf("closed after 0 bytes: %w", io.ErrUnexpectedEOF)

// wireError classifies an I/O error: the deadline or the context is
// ErrDeadline, the rest ErrIO.
func (c *Client) wireError(ctx context.Context, where, container, what string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil {
		if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		return errorf(ErrDeadline, where, container, what+" (bound "+c.timeout.String()+")", err)
	}
	return errorf(ErrIO, where, container, what, err)
}

// candidates lists the addresses dial tries for a sandbox, in order.
func (c *Client) candidates(sandboxID string) []string {
	var out []string
	for _, r := range c.roots {
		out = append(out, filepath.Join(r, "runsc-"+sandboxID+".sock"))
	}
	if c.abstract {
		// runsc binds "\x00runsc-sandbox.<id>" through golang.org/x/sys,
		// which before v0.14.0 (commit 1e638101, 2023-10) counted a
		// trailing NUL in an abstract name's length: every runsc that
		// used abstract sockets (x/sys v0.2.0 to v0.4.0 up to
		// release-20230920) binds the name with a NUL at its end
		// (observed on Debian's 20221219: addrlen 26 for a 22-byte
		// name). The name without it is tried too, for a build with a
		// newer x/sys.
		out = append(out, "@runsc-sandbox."+sandboxID+"\x00", "@runsc-sandbox."+sandboxID)
	}
	return out
}

// dial connects to the first candidate that answers. A candidate that is
// missing (ENOENT) or refuses (ECONNREFUSED: a socket file left by a dead
// sandbox, or no such abstract name) is skipped; any other error ends the
// search.
func (c *Client) dial(ctx context.Context, sandboxID string) (net.Conn, string, error) {
	var errs []error
	cands := c.candidates(sandboxID)
	// The address that answered before first (its dialect is known): on a
	// runsc with abstract sockets the files are never there, and each
	// failed dial costs a socket.
	c.mu.Lock()
	for i, a := range cands {
		if _, ok := c.dialects[a]; ok {
			cands = append([]string{a}, slices.Delete(cands, i, i+1)...)
			break
		}
	}
	c.mu.Unlock()
	for _, addr := range cands {
		conn, err := c.dialAddr(ctx, addr)
		if err == nil {
			return conn, addr, nil
		}
		// The errno alone: net's error text carries the address raw
		// (an abstract name's NUL bytes).
		var errno syscall.Errno
		if errors.As(err, &errno) {
			err = errno
		}
		err = fmt.Errorf("%s: %w", printable(addr), err)
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, "", err
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, "", errors.New("no candidate")
	}
	return nil, "", errors.Join(errs...)
}

// dialAddr connects to one address (a path or @abstract).
func (c *Client) dialAddr(ctx context.Context, addr string) (net.Conn, error) {
	return dialUnix(ctx, addr)
}

// dialect returns the memo for addr, and whether there is none.
func (c *Client) dialect(addr string) (Dialect, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.dialects[addr]
	return d, !ok
}

// learn remembers the argument form addr accepted.
func (c *Client) learn(addr string, d Dialect) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.dialects[addr]; !ok && len(c.dialects) >= maxDialects {
		clear(c.dialects) // sandboxes come and go: relearning costs one call each
	}
	c.dialects[addr] = d
}

// printable shows an address with its NUL bytes escaped.
func printable(addr string) string { return strings.ReplaceAll(addr, "\x00", `\x00`) }

// cutID cuts an id for an error message (the caller's, not foreign text;
// %q escapes it).
func cutID(id string) string {
	if len(id) > MaxIDBytes {
		return id[:MaxIDBytes] + "..."
	}
	return id
}

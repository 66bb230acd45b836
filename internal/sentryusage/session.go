package sentryusage

import (
	"context"
	"net"
	"sync"
	"time"
)

// A Session is a Client that keeps its connection to one sentry between
// Reads, for a caller that reads one sandbox again and again (statsd's
// per-container breakdown holds one per bound gVisor workload). gVisor's
// control server serves calls on a connection one after another until the
// client closes it (pkg/urpc/urpc.go: StartHandling runs handleRegistered,
// a loop of handleOne, each one request and one reply, until a read or
// write fails), so a kept connection saves the dial: a socket, a connect
// and a close here, an accept and a new goroutine in the sentry.
//
// A Read on a kept connection writes the request and reads one reply under
// the same deadline and size cap as Client.Read. Any error closes the
// connection and the next Read dials anew. Before it writes, a Read checks
// that the sentry sent nothing unasked (no byte readable, not closed); if
// it did, the connection is closed and the Read dials anew. A kept
// connection the sentry closed or reset before answering is dialled again
// once, within the Read's deadline. So a Read dials at most once (twice
// while the socket's argument form is being learnt, as Client.Read).
//
// The connection is closed KeepFor (Config) after its dial, or by Close,
// whichever is first; one in use by a Read then is closed when that Read
// ends. A Session holds at most one idle connection, for the sandbox of its
// last Read; concurrent Reads each use their own (the second dials). It is
// safe for concurrent use.
type Session struct {
	c *Client

	mu     sync.Mutex
	closed bool
	kept   *keptConn // idle, not in use by a Read
}

// keptConn is one connection and what it is a connection to.
type keptConn struct {
	conn      net.Conn
	sandboxID string
	addr      string
	timer     *time.Timer // KeepFor after the dial; nil outside a Session
	expired   bool        // set by timer; guarded by the Session's mu
}

// Session returns a new Session on c's configuration and dialect memo. The
// caller must Close it.
func (c *Client) Session() *Session { return &Session{c: c} }

// Read is Client.Read on the kept connection (see Session).
func (s *Session) Read(ctx context.Context, q Query) (Usage, error) {
	return s.c.read(ctx, q, s)
}

// Close closes the kept connection; a Read in flight closes its own when it
// ends. A Read after Close keeps nothing. Close always returns nil.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	kc := s.kept
	s.kept = nil
	s.mu.Unlock()
	kc.close()
	return nil
}

// take returns the idle connection for sandboxID and takes it out of s, or
// nil (a connection to another sandbox is closed). A nil s has none.
func (s *Session) take(sandboxID string) *keptConn {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	kc := s.kept
	s.kept = nil
	s.mu.Unlock()
	if kc != nil && kc.sandboxID != sandboxID {
		kc.close()
		return nil
	}
	return kc
}

// wrap makes a fresh connection a keptConn, with its KeepFor timer when s
// is not nil.
func (s *Session) wrap(conn net.Conn, sandboxID, addr string) *keptConn {
	kc := &keptConn{conn: conn, sandboxID: sandboxID, addr: addr}
	if s != nil {
		kc.timer = time.AfterFunc(s.c.keepFor, func() { s.expire(kc) })
	}
	return kc
}

// expire closes kc if it is idle in s, or marks it so that the Read using
// it closes it.
func (s *Session) expire(kc *keptConn) {
	s.mu.Lock()
	kc.expired = true
	idle := s.kept == kc
	if idle {
		s.kept = nil
	}
	s.mu.Unlock()
	if idle {
		kc.conn.Close()
	}
}

// put keeps kc after a successful Read, unless s is nil or closed, kc has
// expired, or s already keeps another: then kc is closed.
func (s *Session) put(kc *keptConn) {
	if s == nil {
		kc.close()
		return
	}
	s.mu.Lock()
	if s.closed || kc.expired || s.kept != nil {
		s.mu.Unlock()
		kc.close()
		return
	}
	s.kept = kc
	s.mu.Unlock()
}

// close closes the connection and stops its timer; nil is a no-op.
func (kc *keptConn) close() {
	if kc == nil {
		return
	}
	if kc.timer != nil {
		kc.timer.Stop()
	}
	kc.conn.Close()
}

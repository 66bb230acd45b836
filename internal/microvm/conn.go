package microvm

// This file is the agent connection's lifecycle: one ttrpc connection kept
// across Samples, dialled on demand (one dial in flight, shared), dropped
// when its transport breaks, cut when the agent misbehaves on it, and the
// backoff before the next dial after a failed dial or a cut.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// agentConn is one ttrpc connection and what it learned at setup.
type agentConn struct {
	client  *ttrpc.Client
	guard   *frameGuard
	version agentVersion
	born    time.Time     // when it was dialled
	gone    chan struct{} // closed when the connection has ended
	// timeouts counts the calls in a row that got no answer in time.
	timeouts atomic.Int32
	// cutFor is why the source cut it for unanswered calls (nil: not cut).
	cutFor atomic.Pointer[error]
}

// cutReason is why the connection was cut for misbehaving: a frame the
// guard refused, or calls unanswered in a row; nil if it was not.
func (c *agentConn) cutReason() error {
	if v := c.guard.Violation(); v != nil {
		return v
	}
	if p := c.cutFor.Load(); p != nil {
		return *p
	}
	return nil
}

// sentinelOf classifies a cut: for unanswered calls it is a timeout, for
// frames the guard refused a malformed answer.
func sentinelOf(why error) error {
	switch {
	case errors.Is(why, source.ErrTimeout):
		return source.ErrTimeout
	case errors.Is(why, source.ErrMalformed):
		return source.ErrMalformed
	}
	return source.ErrNotMeasurable
}

func (c *agentConn) dead() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// answered notes that the agent answered on c: the timeouts in a row start
// over.
func (s *guestSource) answered(c *agentConn) { c.timeouts.Store(0) }

// connection returns the live connection, dialling one (shared by
// concurrent callers, bounded) unless a recent dial failed.
func (s *guestSource) connection(ctx context.Context) (*agentConn, error) {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, fmt.Errorf("microvm: %w: source for %s is closed", source.ErrNotMeasurable, s.addr)
	case s.conn != nil && !s.conn.dead():
		c := s.conn
		s.mu.Unlock()
		return c, nil
	case s.conn != nil:
		if v := s.conn.guard.Violation(); v != nil {
			s.strikeLocked(s.conn, v) // cut by the guard outside any call
		}
		s.log.Debug("agent connection ended; redialling")
		s.conn = nil
	}
	if wait := s.retryAt.Sub(s.now()); wait > 0 {
		err, failures, strikes, wasCut := s.lastErr, s.failures, s.strikes, s.lastWasCut
		s.mu.Unlock()
		// An agent cut for not answering is still timing out.
		sentinel := source.ErrNotMeasurable
		if wasCut {
			sentinel = sentinelOf(err)
		}
		return nil, fmt.Errorf("microvm: %w: agent %s: next dial in %s after %d failed dial(s), %d connection(s) cut; last: %v",
			sentinel, s.addr, wait.Round(time.Millisecond), failures, strikes, err)
	}
	s.mu.Unlock()
	return bounded.Do(ctx, s.dials, "dial "+s.addr.String(), s.dial)
}

// dial connects, learns the agent's version and installs the connection.
func (s *guestSource) dial() (*agentConn, error) {
	c, err := s.connect()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failures++
		backoff := s.cfg.backoff(s.failures)
		s.retryAt, s.lastErr, s.lastWasCut = s.now().Add(backoff), err, false
		s.log.Debug("agent dial failed", "err", err, "failures", s.failures, "backoff", backoff)
		return nil, err
	}
	if s.closed {
		c.client.Close()
		return nil, fmt.Errorf("microvm: %w: source for %s closed while dialling", source.ErrNotMeasurable, s.addr)
	}
	s.failures, s.retryAt, s.lastErr = 0, time.Time{}, nil
	s.conn = c
	s.log.Debug("agent connected", "agent_version", c.version.Raw)
	return c, nil
}

func (s *guestSource) connect() (*agentConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	defer cancel()
	conn, err := dial(ctx, s.addr, s.cfg.DialVsock)
	if err != nil {
		return nil, fmt.Errorf("microvm: %w", err)
	}
	c := &agentConn{guard: newFrameGuard(conn, s.cfg.MaxFrameBytes, s.cfg.CallTimeout), born: s.now(), gone: make(chan struct{})}
	c.client = ttrpc.NewClient(c.guard, ttrpc.WithOnClose(func() { close(c.gone) }),
		ttrpc.WithUnaryClientInterceptor(payloadBudget()))

	vctx, vcancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	defer vcancel()
	var vr katagrpc.VersionCheckResponse
	if err := c.client.Call(vctx, healthService, versionMethod, &katagrpc.CheckRequest{}, &vr); err != nil {
		if _, isStatus := status.FromError(err); !isStatus {
			c.client.Close()
			sentinel := source.ErrNotMeasurable
			if errors.Is(err, context.DeadlineExceeded) {
				sentinel = source.ErrTimeout
			}
			if v := c.guard.Violation(); v != nil {
				err = v
			}
			return nil, fmt.Errorf("microvm: %w: Version at %s: %w", sentinel, s.addr, err)
		}
		// The agent answered but would not say (policy, old agent): its
		// version stays unknown and CPU of a v2 guest unverified.
		s.log.Debug("agent refused Version", "err", err)
		st, _ := status.FromError(err)
		c.version = parseAgentVersion(fmt.Sprintf("unavailable: Version answered %s", st.Code()), "")
		return c, nil
	}
	// The guest writes these: cut and cleaned where they enter.
	c.version = parseAgentVersion(foreign.Text(vr.GetAgentVersion()), foreign.Text(vr.GetGrpcVersion()))
	return c, nil
}

// drop closes c if it is still the current connection.
func (s *guestSource) drop(c *agentConn, cause error) {
	c.client.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == c {
		s.conn = nil
		s.log.Debug("agent connection dropped", "err", cause)
	}
}

// cut closes c because the agent misbehaved on it (frames no call asked
// for, calls that time out in a row) and, if c is still the current
// connection, delays the next dial by a backoff that grows with each such
// connection in a row: a hostile agent cannot make the source redial in a
// loop.
func (s *guestSource) cut(c *agentConn, why error) {
	c.cutFor.CompareAndSwap(nil, &why)
	c.client.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == c {
		s.conn = nil
		s.strikeLocked(c, why)
	}
}

// strikeLocked counts c as a misbehaving connection and sets the backoff:
// doubling per connection cut in a row, starting over when c had lived
// longer than the longest backoff (an agent healthy for a while that then
// misbehaves once). Called with mu held.
func (s *guestSource) strikeLocked(c *agentConn, why error) {
	if s.now().Sub(c.born) > s.cfg.MaxBackoff {
		s.strikes = 0
	}
	s.strikes++
	backoff := s.cfg.backoff(s.strikes)
	s.retryAt, s.lastErr, s.lastWasCut = s.now().Add(backoff), why, true
	s.log.Warn("agent connection cut", "why", why, "strikes", s.strikes, "backoff", backoff)
}

// backoff is how long the source waits before the next dial after n failed
// dials, or n connections cut, in a row (n >= 1): MinBackoff, doubled per
// one after the first, at most MaxBackoff.
func (c Config) backoff(n int) time.Duration {
	b := c.MinBackoff << min(n-1, 20)
	if b > c.MaxBackoff || b <= 0 {
		b = c.MaxBackoff
	}
	return b
}

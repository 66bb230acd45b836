package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// The agent's ttrpc names (proto/kata/grpc).
const (
	agentService  = "grpc.AgentService"
	statsMethod   = "StatsContainer"
	healthService = "grpc.Health"
	versionMethod = "Version"
)

// Defaults of Config.
const (
	DefaultCallTimeout = 2 * time.Second
	DefaultMinBackoff  = 250 * time.Millisecond
	DefaultMaxBackoff  = 10 * time.Second
)

// Config holds the bounds of a micro-VM source. The zero value is usable.
type Config struct {
	// CallTimeout bounds every agent call (StatsContainer, Version) and,
	// separately, the dial with its hybrid-vsock handshake. Default 2 s.
	CallTimeout time.Duration
	Logger      *slog.Logger
	// DialVsock opens vsock://cid:port addresses. Nil means
	// github.com/mdlayher/vsock. Tests inject a fake.
	DialVsock VsockDialFunc
	// After a failed dial, the source does not redial for MinBackoff,
	// doubling per consecutive failure up to MaxBackoff; meanwhile Sample
	// fails fast with ErrNotMeasurable. Defaults 250 ms and 10 s.
	MinBackoff, MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	return c
}

// Open returns a Source for the guest agent ref names, summing the
// containers ref.ContainerIDs. The ref must be valid (identity.ValidateRef:
// a dialable address, 1 to identity.MaxContainerIDs distinct ids); Open
// only parses the address. It does not dial until the first Sample. Close
// it to drop the agent connection.
func Open(ref source.SandboxRef, cfg Config) (source.Source, error) {
	return open(ref, cfg)
}

func open(ref source.SandboxRef, cfg Config) (*guestSource, error) {
	addr, err := ParseAddress(ref.AgentAddress)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &guestSource{
		addr: addr,
		ids:  append([]string(nil), ref.ContainerIDs...),
		cfg:  cfg,
		log:  cfg.Logger.With("component", "microvm", "agent", addr.String()),
		// The calls bound themselves (CallTimeout each, so their errors say
		// what ran out of time); the groups add sharing and the caller's
		// own deadline.
		dials: bounded.New(0),
		calls: bounded.New(0),
		now:   time.Now,
	}, nil
}

// guestSource reads a micro-VM's workload through its guest agent. It keeps one
// ttrpc connection across Samples; it is safe for concurrent use.
type guestSource struct {
	addr  Address
	ids   []string
	cfg   Config
	log   *slog.Logger
	dials *bounded.Group // one dial in flight, shared
	calls *bounded.Group // one StatsContainer in flight per container id
	now   func() time.Time

	mu       sync.Mutex
	conn     *agentConn // nil: not connected
	closed   bool
	failures int       // consecutive failed dials
	retryAt  time.Time // no dial before this
	lastErr  error     // the last dial failure
}

var _ source.Source = (*guestSource)(nil)

// agentConn is one ttrpc connection and what it learned at setup.
type agentConn struct {
	client  *ttrpc.Client
	version agentVersion
	gone    chan struct{} // closed when the connection has ended
}

func (c *agentConn) dead() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// Sample reads every container and sums them. See the package doc and
// aggregate for what a partial or failed sweep returns.
func (s *guestSource) Sample(ctx context.Context) (source.Reading, error) {
	c, err := s.connection(ctx)
	if err != nil {
		return source.Reading{}, err
	}
	results := make([]containerResult, len(s.ids))
	if len(s.ids) == 1 {
		results[0] = s.readContainer(ctx, c, s.ids[0])
	} else {
		var wg sync.WaitGroup
		for i, id := range s.ids {
			wg.Go(func() { results[i] = s.readContainer(ctx, c, id) })
		}
		wg.Wait()
	}
	return aggregate(s.addr.String(), c.version, results)
}

// readContainer calls StatsContainer for id (one call in flight per id) and
// converts the reply.
func (s *guestSource) readContainer(ctx context.Context, c *agentConn, id string) containerResult {
	resp, err := bounded.Do(ctx, s.calls, id, func() (*katagrpc.StatsContainerResponse, error) {
		cctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
		defer cancel()
		var resp katagrpc.StatsContainerResponse
		err := c.client.Call(cctx, agentService, statsMethod, &katagrpc.StatsContainerRequest{ContainerId: id}, &resp)
		if err != nil {
			return nil, s.callError(c, "StatsContainer", id, err)
		}
		return &resp, nil
	})
	if err != nil {
		return containerResult{ID: id, Err: err, Why: reason(err)}
	}
	st, err := convertContainer(id, resp, c.version)
	if err != nil {
		return containerResult{ID: id, Err: err, Why: err.Error()}
	}
	return containerResult{ID: id, Stats: st}
}

// errUnknownContainer marks the agent's answer for an id it does not know.
var errUnknownContainer = errors.New(source.ReasonUnknownContainer)

// callError classifies a failed ttrpc call and, when the connection itself
// broke, drops it so the next Sample redials.
func (s *guestSource) callError(c *agentConn, method, id string, err error) error {
	where := fmt.Sprintf("%s %q at %s", method, id, s.addr)
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.InvalidArgument:
			if st.Message() == "invalid container id" {
				return fmt.Errorf("microvm: %w: %s: %w (agent: %s)", source.ErrNotMeasurable, where, errUnknownContainer, st.Message())
			}
		case codes.DeadlineExceeded:
			return fmt.Errorf("microvm: %w: %s: agent: %s", source.ErrTimeout, where, st.Message())
		case codes.ResourceExhausted:
			return fmt.Errorf("microvm: %w: %s: reply over ttrpc's 4 MiB limit: %s", source.ErrMalformed, where, st.Message())
		}
		return fmt.Errorf("microvm: %w: %s: agent answered %s: %s", source.ErrNotMeasurable, where, st.Code(), st.Message())
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("microvm: %w: %s: no answer within %s", source.ErrTimeout, where, s.cfg.CallTimeout)
	case errors.Is(err, proto.Error):
		return fmt.Errorf("microvm: %w: %s: undecodable reply: %w", source.ErrMalformed, where, err)
	}
	// The transport broke (closed, reset, oversized frame): start over.
	s.drop(c, err)
	return fmt.Errorf("microvm: %w: %s: connection lost: %w", source.ErrNotMeasurable, where, err)
}

// reason is the UnreadContainers text for a failed call.
func reason(err error) string {
	if errors.Is(err, errUnknownContainer) {
		return source.ReasonUnknownContainer
	}
	return err.Error()
}

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
		s.log.Debug("agent connection ended; redialling")
		s.conn = nil
	}
	if wait := s.retryAt.Sub(s.now()); wait > 0 {
		err, failures := s.lastErr, s.failures
		s.mu.Unlock()
		return nil, fmt.Errorf("microvm: %w: agent %s: next dial in %s after %d failure(s); last: %v",
			source.ErrNotMeasurable, s.addr, wait.Round(time.Millisecond), failures, err)
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
		backoff := s.cfg.MinBackoff << min(s.failures-1, 20)
		if backoff > s.cfg.MaxBackoff || backoff <= 0 {
			backoff = s.cfg.MaxBackoff
		}
		s.retryAt, s.lastErr = s.now().Add(backoff), err
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
	c := &agentConn{gone: make(chan struct{})}
	c.client = ttrpc.NewClient(conn, ttrpc.WithOnClose(func() { close(c.gone) }))

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
			return nil, fmt.Errorf("microvm: %w: Version at %s: %w", sentinel, s.addr, err)
		}
		// The agent answered but would not say (policy, old agent): its
		// version stays unknown and CPU of a v2 guest unverified.
		s.log.Debug("agent refused Version", "err", err)
		st, _ := status.FromError(err)
		c.version = parseAgentVersion(fmt.Sprintf("unavailable: Version answered %s", st.Code()), "")
		return c, nil
	}
	c.version = parseAgentVersion(vr.GetAgentVersion(), vr.GetGrpcVersion())
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

// Close closes the agent connection; later Samples fail with
// ErrNotMeasurable. It is safe to call more than once.
func (s *guestSource) Close() error {
	s.mu.Lock()
	c := s.conn
	s.conn, s.closed = nil, true
	s.mu.Unlock()
	if c != nil {
		c.client.Close()
		<-c.gone
	}
	return nil
}

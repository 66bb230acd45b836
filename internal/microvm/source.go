package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
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

// maxTimeoutsInARow is how many calls on one connection may time out in a
// row before the connection is taken for wedged and replaced.
const maxTimeoutsInARow = 3

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
	// DialVsock opens vsock://cid:port addresses (cid >= 3: ParseAddress
	// refuses the rest). Nil means github.com/mdlayher/vsock; statsd never
	// sets it. Tests inject a fake.
	DialVsock VsockDialFunc
	// After a failed dial, or a connection cut for misbehaving (frames no
	// call asked for, maxTimeoutsInARow calls in a row unanswered), the
	// source does not redial for MinBackoff, doubling per consecutive
	// failure up to MaxBackoff; meanwhile Sample fails fast with
	// ErrNotMeasurable (ErrTimeout after a cut for unanswered calls).
	// Defaults 250 ms and 10 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxFrameBytes bounds one ttrpc frame from the agent; a larger one
	// cuts the connection. Default maxAgentFrameBytes (256 KiB), at most
	// ttrpc's own 4 MiB.
	MaxFrameBytes int
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
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = maxAgentFrameBytes
	}
	c.MaxFrameBytes = min(c.MaxFrameBytes, ttrpcMaxMessage)
	return c
}

// Open returns a Source for the guest agent ref names, summing the
// containers of ref.ContainerSet (SetContainers changes them while it stays
// open). The ref must be valid (identity.ValidateRef: a dialable address, 1
// to identity.MaxContainerIDs distinct ids); Open only parses the address. It does not dial until the first Sample. Close
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
	s := &guestSource{
		addr:     addr,
		addrText: addr.String(),
		cfg:      cfg,
		log:      cfg.Logger.With("component", "microvm", "agent", addr.String()),
		// The calls bound themselves (CallTimeout each, so their errors say
		// what ran out of time); the groups add sharing and the caller's
		// own deadline.
		dials: bounded.New(0),
		calls: bounded.New(0),
		now:   time.Now,
	}
	s.SetContainers(ref.ContainerSet())
	return s, nil
}

// SetContainers makes set the containers read from the next Sample on; the
// connection stays. Each container's figures are its guest cgroup's own
// (since it started), so a container added mid-activation needs no
// baseline of its own: all its usage is within the activation.
func (s *guestSource) SetContainers(set []source.ContainerRef) {
	ids := source.ContainerIDsOf(set)
	s.ids.Store(&ids)
}

// guestSource reads a micro-VM's workload through its guest agent. It keeps one
// ttrpc connection across Samples; it is safe for concurrent use.
type guestSource struct {
	addr     Address
	addrText string                   // addr.String(), named in every sample
	ids      atomic.Pointer[[]string] // the containers read, in order (SetContainers)
	cfg      Config
	log      *slog.Logger
	dials    *bounded.Group // one dial in flight, shared
	calls    *bounded.Group // one StatsContainer in flight per container id
	now      func() time.Time

	mu       sync.Mutex
	conn     *agentConn // nil: not connected
	closed   bool
	failures int       // consecutive failed dials
	strikes  int       // consecutive connections cut for misbehaving (reset by an answer)
	retryAt  time.Time // no dial before this
	lastErr  error     // the last dial failure, or why the last connection was cut
	// lastWasCut: lastErr is why a connection was cut, not a dial failure.
	lastWasCut bool
}

var (
	_ source.Source          = (*guestSource)(nil)
	_ source.ContainerSetter = (*guestSource)(nil)
)

// Sample reads every container and sums them. See the package doc and
// aggregate for what a partial or failed sweep returns.
func (s *guestSource) Sample(ctx context.Context) (source.Reading, error) {
	c, err := s.connection(ctx)
	if err != nil {
		return source.Reading{}, err
	}
	ids := *s.ids.Load()
	if len(ids) == 1 {
		one := [1]containerResult{s.readContainer(ctx, c, ids[0])}
		return aggregate(s.addrText, c.version, one[:])
	}
	results := make([]containerResult, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { results[i] = s.readContainer(ctx, c, id) })
	}
	wg.Wait()
	return aggregate(s.addrText, c.version, results)
}

// readContainer calls StatsContainer for id (one call in flight per id) and
// converts the reply. The call runs on a bounded worker, never on the
// caller's goroutine: ttrpc writes a connection's requests one at a time,
// so a call may wait behind its siblings' writes (each bounded by the
// guard's write deadline) longer than its caller may wait.
func (s *guestSource) readContainer(ctx context.Context, c *agentConn, id string) containerResult {
	call := func() (*katagrpc.StatsContainerResponse, error) {
		cctx := startCall(s.cfg.CallTimeout)
		defer cctx.end()
		var resp katagrpc.StatsContainerResponse
		err := c.client.Call(cctx, agentService, statsMethod, &katagrpc.StatsContainerRequest{ContainerId: id}, &resp)
		if err != nil {
			return nil, s.callError(c, "StatsContainer", id, err)
		}
		s.answered(c)
		return &resp, nil
	}
	resp, err := bounded.Do(ctx, s.calls, id, call)
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
// broke or has stopped answering, drops it so the next Sample redials. The
// agent's words (a status message) are quoted and cut: the guest writes
// them.
func (s *guestSource) callError(c *agentConn, method, id string, err error) error {
	where := fmt.Sprintf("%s %q at %s", method, id, s.addr)
	if st, ok := status.FromError(err); ok {
		if st.Code() != codes.ResourceExhausted { // that one is ttrpc's own, client side
			s.answered(c)
		}
		msg := foreign.Quote(st.Message())
		switch st.Code() {
		case codes.InvalidArgument:
			if st.Message() == "invalid container id" {
				return fmt.Errorf("microvm: %w: %w: %s: %w (agent: %s)", source.ErrNotMeasurable, source.ErrAnswered, where, errUnknownContainer, msg)
			}
		case codes.DeadlineExceeded:
			return fmt.Errorf("microvm: %w: %w: %s: agent: %s", source.ErrTimeout, source.ErrAnswered, where, msg)
		case codes.ResourceExhausted:
			return fmt.Errorf("microvm: %w: %s: reply over ttrpc's 4 MiB limit: %s", source.ErrMalformed, where, msg)
		}
		return fmt.Errorf("microvm: %w: %w: %s: agent answered %s: %s", source.ErrNotMeasurable, source.ErrAnswered, where, st.Code(), msg)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		if n := c.timeouts.Add(1); n >= maxTimeoutsInARow {
			s.cut(c, fmt.Errorf("%w: %d calls in a row got no answer within %s", source.ErrTimeout, n, s.cfg.CallTimeout))
		}
		return fmt.Errorf("microvm: %w: %s: no answer within %s", source.ErrTimeout, where, s.cfg.CallTimeout)
	case errors.Is(err, errOverBudget) && !errors.Is(err, errHostileFrame):
		// A payload refused undecoded (replybudget.go); the connection is
		// sound. (An envelope over its budget is the guard's cut, below.)
		s.answered(c)
		return fmt.Errorf("microvm: %w: %s: %w", source.ErrMalformed, where, err)
	case errors.Is(err, proto.Error):
		return fmt.Errorf("microvm: %w: %s: undecodable reply: %w", source.ErrMalformed, where, err)
	}
	if why := c.cutReason(); why != nil {
		// Cut for what the agent sent or did not answer (this call was
		// pending on it): redial only after a backoff.
		s.cut(c, why)
		return fmt.Errorf("microvm: %w: %s: connection cut: %w", sentinelOf(why), where, why)
	}
	// The transport broke (closed, reset, oversized frame): start over.
	s.drop(c, err)
	return fmt.Errorf("microvm: %w: %s: connection lost: %w", source.ErrNotMeasurable, where, err)
}

// maxReasonBytes bounds one UnreadContainers reason: 25 of them go in an
// answer.
const maxReasonBytes = 768

// reason is the UnreadContainers text for a failed call.
func reason(err error) string {
	if errors.Is(err, errUnknownContainer) {
		return source.ReasonUnknownContainer
	}
	return foreign.Bound(err.Error(), maxReasonBytes)
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

package server

// This file bounds the reads statsd serves at once, across every connection
// of the read socket, and shares one discovery answer among the callers
// that ask for it while its reads are in flight (issue 34): a reader's storm
// of discovery reads costs statsd one set of source reads and one answer at
// a time, the reads beyond the bound are refused at once, and the
// lifecycle socket (which takes no lock a read holds) is left the CPU and
// the heap.

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// DefaultMaxReads is how many reads (StatsWorkload, StatsActiveWorkloads,
// StatsHost, ListEndedActivations) statsd serves at once by default, across
// every connection: a node agent and a few tools poll one at a time each.
const DefaultMaxReads = 64

// readGate admits at most cap(slots) reads at once; one more is refused
// at once (RESOURCE_EXHAUSTED TOO_MANY_READS), never queued: a queue would
// hold the storm's streams, and their memory, for as long as it lasts.
type readGate struct{ slots chan struct{} }

func newReadGate(n int) *readGate { return &readGate{slots: make(chan struct{}, n)} }

// enter takes a slot or returns the status that refuses the read; a read
// that entered calls leave when its answer is built.
func (g *readGate) enter() error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
		return statusError(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS,
			"%d reads are in flight, the most this statsd serves at once (--max-reads): nothing was read; retry after a backoff", cap(g.slots))
	}
}

func (g *readGate) leave() { <-g.slots }

// WithMaxReads bounds the reads served at once to n (at least 1; the
// default is DefaultMaxReads). Call it before serving.
func (s *StatsService) WithMaxReads(n int) *StatsService {
	s.gate = newReadGate(max(n, 1))
	return s
}

// activeFlight is one discovery answer being built. Every caller that asks
// with the same include_host while its reads are in flight, and whose own
// reads would be bounded to end no sooner, joins it instead of reading
// again; once its reads are done it takes no one more (the answer is the
// state after them: after every member's arrival).
type activeFlight struct {
	readsEnd time.Time // when its reads are bounded to end
	done     chan struct{}
	resp     *sandboxstatsv1.StatsActiveWorkloadsResponse // read-only once done is closed
	err      error
}

// activeShare holds the flight callers may join, by include_host.
type activeShare struct {
	mu   sync.Mutex
	open [2]*activeFlight
}

// shared answers a discovery read from the flight open for includeHost if
// the caller can wait for its reads, else from a flight of its own (which
// later callers join), built by build (given the bound of each read and a
// func that closes the flight to joiners, to call before the answer's
// state is taken). A member whose context ends first gets its context's
// status; the flight goes on for the others.
func (s *StatsService) shared(ctx context.Context, includeHost bool, build func(ctx context.Context, bound time.Duration, closeJoin func()) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error)) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	key := 0
	if includeHost {
		key = 1
	}
	bound := s.readBound(ctx)
	readsEnd := time.Now().Add(bound)
	s.share.mu.Lock()
	f := s.share.open[key]
	if f == nil || f.readsEnd.After(readsEnd) {
		f = &activeFlight{readsEnd: readsEnd, done: make(chan struct{})}
		s.share.open[key] = f
		s.share.mu.Unlock()
		closeJoin := func() {
			s.share.mu.Lock()
			if s.share.open[key] == f {
				s.share.open[key] = nil
			}
			s.share.mu.Unlock()
		}
		f.err = status.Error(codes.Internal, "the discovery answer failed") // if build panics
		func() {
			defer close(f.done)
			defer closeJoin() // also when build panics
			// The flight outlives a leader that goes away: its members
			// wait for it. Each read is bounded by bound.
			f.resp, f.err = build(context.WithoutCancel(ctx), bound, closeJoin)
		}()
	} else {
		s.share.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return f.resp, f.err
}

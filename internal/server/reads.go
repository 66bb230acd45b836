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
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// DefaultMaxReads is how many reads (the calls of WorkloadStatsService:
// StatsWorkload, StatsActiveWorkloads, StatsHost, ListEndedActivations)
// statsd serves at once by default, across every connection: a node agent
// and a few tools poll one call at a time each (the load test's 64 pollers
// each wait 2 ms between calls; a slot is left as its status is queued,
// before the poller has it). Each slot held in a storm is about a quarter
// MiB of statsd's peak: at 128, 128 x 16 streams took it to 60 MiB, at 64
// to 45 to 50.
const DefaultMaxReads = 64

// readGate admits at most cap(slots) reads at once; one more is refused
// at once (RESOURCE_EXHAUSTED TOO_MANY_READS), never queued: a queue would
// hold the storm's streams, and their memory, for as long as it lasts.
type readGate struct {
	slots   chan struct{}
	refusal error // the same status for every refused read: built once
}

func newReadGate(n int) *readGate {
	return &readGate{slots: make(chan struct{}, n), refusal: statusError(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS,
		"%d reads are in flight, the most this statsd serves at once (--max-reads): nothing was read; retry after a backoff", n)}
}

// enter takes a slot or returns the status that refuses the read; a read
// that entered calls leave once answered.
func (g *readGate) enter() error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
		return g.refusal
	}
}

func (g *readGate) leave() { <-g.slots }

// WithMaxReads bounds the reads served at once to n (at least 1; the
// default is DefaultMaxReads). Call it before serving.
func (s *StatsService) WithMaxReads(n int) *StatsService {
	s.gate = newReadGate(max(n, 1))
	return s
}

// readsPrefix begins the method name of every read.
var readsPrefix = "/" + sandboxstatsv1.WorkloadStatsService_ServiceDesc.ServiceName + "/"

// ServerOptions are the options of the server s is registered on. The read
// gate: a read's stream is admitted (a gate slot taken) as its headers
// arrive, before gRPC starts a goroutine for it, and its slot is left when
// the stream ends (its status written, or the stream reset); one beyond
// the bound is answered RESOURCE_EXHAUSTED TOO_MANY_READS there and then,
// costing no goroutine and no read. Other services on the server (health,
// reflection) are not bounded by it. And the codec that encodes a shared
// discovery answer once for all its streams (answerCodec).
func (s *StatsService) ServerOptions() []grpc.ServerOption {
	gate := grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !strings.HasPrefix(info.FullMethodName, readsPrefix) {
			return ctx, nil
		}
		g := s.gate
		if err := g.enter(); err != nil {
			return ctx, err
		}
		// The stream's context ends with the stream, whatever ends it.
		context.AfterFunc(ctx, g.leave)
		return ctx, nil
	})
	return []grpc.ServerOption{gate, grpc.ForceServerCodecV2(answerCodec{proto: encoding.GetCodecV2(protoenc.Name), s: s})}
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
	// wire is resp encoded once for every member's stream (answerCodec);
	// unsent counts the members that returned resp and whose stream has
	// not encoded it yet (guarded by activeShare.mu).
	wire   []byte
	unsent int
	sendAs *sandboxstatsv1.StatsActiveWorkloadsResponse // its key in activeShare.sending
}

// activeShare holds the flight callers may join, by include_host, and the
// flights whose encoded answer members' streams have yet to send.
type activeShare struct {
	mu      sync.Mutex
	open    [2]*activeFlight
	sending map[*sandboxstatsv1.StatsActiveWorkloadsResponse]*activeFlight
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
		f = &activeFlight{readsEnd: readsEnd, done: make(chan struct{}), unsent: 1}
		s.share.open[key] = f
		s.share.mu.Unlock()
		s.lead(ctx, key, f, bound, build)
	} else {
		f.unsent++
		s.share.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			s.sent(f)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if err := ctx.Err(); err != nil {
		s.sent(f)
		return nil, status.FromContextError(err).Err()
	}
	if f.err != nil {
		s.sent(f)
		return nil, f.err
	}
	return f.resp, nil
}

// lead builds f's answer (closing it to joiners before the answer's state
// is taken) and encodes it once for its members' streams.
func (s *StatsService) lead(ctx context.Context, key int, f *activeFlight, bound time.Duration, build func(ctx context.Context, bound time.Duration, closeJoin func()) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error)) {
	closeJoin := func() {
		s.share.mu.Lock()
		if s.share.open[key] == f {
			s.share.open[key] = nil
		}
		s.share.mu.Unlock()
	}
	f.err = status.Error(codes.Internal, "the discovery answer failed") // if build panics
	defer close(f.done)
	defer closeJoin() // also when build panics
	// The flight outlives a leader that goes away: its members wait for
	// it. Each read is bounded by bound.
	f.resp, f.err = build(context.WithoutCancel(ctx), bound, closeJoin)
	if f.err != nil {
		return
	}
	closeJoin() // members are counted: none joins from here
	wire, err := proto.Marshal(f.resp)
	if err != nil {
		return // each stream encodes it, and fails, alone
	}
	s.share.mu.Lock()
	defer s.share.mu.Unlock()
	if f.unsent <= 0 {
		return // every member went away
	}
	f.wire, f.sendAs = wire, f.resp
	if s.share.sending == nil {
		s.share.sending = make(map[*sandboxstatsv1.StatsActiveWorkloadsResponse]*activeFlight)
	}
	s.share.sending[f.resp] = f
}

// sent notes that a member of f will not, or no longer needs to, encode
// f's answer; after the last one, the encoded answer is let go.
func (s *StatsService) sent(f *activeFlight) {
	s.share.mu.Lock()
	defer s.share.mu.Unlock()
	if f.unsent--; f.unsent <= 0 && f.sendAs != nil && s.share.sending[f.sendAs] == f {
		delete(s.share.sending, f.sendAs)
	}
}

// encoded returns the encoded answer when r is a shared discovery answer
// still being sent, and notes its stream's encoding done.
func (s *StatsService) encoded(r *sandboxstatsv1.StatsActiveWorkloadsResponse) ([]byte, bool) {
	s.share.mu.Lock()
	f := s.share.sending[r]
	s.share.mu.Unlock()
	if f == nil {
		return nil, false
	}
	s.sent(f)
	return f.wire, true
}

// answerCodec is the read server's codec: gRPC's proto codec, except that a
// shared discovery answer is encoded once for every stream that returns it
// (its streams queue the same bytes; encoded apart, a storm's answers
// waiting to be written took a copy each).
type answerCodec struct {
	proto encoding.CodecV2
	s     *StatsService
}

func (c answerCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*sandboxstatsv1.StatsActiveWorkloadsResponse); ok {
		if wire, ok := c.s.encoded(r); ok {
			// A SliceBuffer is never written to or returned to a pool:
			// every stream reads the same bytes.
			return mem.BufferSlice{mem.SliceBuffer(wire)}, nil
		}
	}
	return c.proto.Marshal(v)
}

func (c answerCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
func (c answerCodec) Name() string                                { return c.proto.Name() }

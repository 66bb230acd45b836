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
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// DefaultMaxReads is how many reads (the calls of WorkloadStatsService:
// StatsWorkload, StatsActiveWorkloads, StatsHost, ListEndedActivations)
// statsd serves at once by default, across every connection: a node agent
// and a few tools poll one call at a time each (the load test's 64 pollers
// each wait 2 ms between calls; a slot is left as its handler returns,
// before the poller has the answer). At 64, 128 x 16 streams took statsd's
// peak to 43-44 MiB on an idle machine (TestIntegrationDiscoveryStorm).
const DefaultMaxReads = 64

// readGate admits at most cap(slots) reads at once; one more is refused
// at once (RESOURCE_EXHAUSTED TOO_MANY_READS), never queued: a queue would
// hold the storm's streams, and their memory, for as long as it lasts.
type readGate struct {
	slots chan struct{}
	// refusal is the same status for every refused read, built at the
	// first: a statsd that never refuses a read should not keep it (with
	// errdetails' descriptors, which statsd no longer links, it was about
	// 48 KiB of heap).
	refusal func() error
}

func newReadGate(n int) *readGate {
	return &readGate{slots: make(chan struct{}, n), refusal: sync.OnceValue(func() error {
		return statusError(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS,
			"%d reads are in flight, the most this statsd serves at once (--max-reads): nothing was read; retry after a backoff", n)
	})}
}

// enter takes a slot or returns the status that refuses the read; a read
// that entered calls leave once answered.
func (g *readGate) enter() error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
		return g.refusal()
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
// gate, the server's first interceptor: a read takes a slot (one beyond the
// bound is answered RESOURCE_EXHAUSTED TOO_MANY_READS at once, reading
// nothing) and leaves it when its handler returns. Other services on the
// server (health, reflection) are not bounded by it. And the codec that
// encodes a shared discovery answer once for all its streams
// (answerCodec).
//
// The gate is not in gRPC's tap (grpc.InTapHandle), where a refusal would
// cost no goroutine: grpc-go (v1.85.0, http2Server.operateHeaders) never
// cancels the context of a stream its tap refused, so each refusal left a
// context with a live timer until the caller's deadline; 148,000 refusals
// in a 10 s storm (128 connections x 16 streams) fired 98,000 timer
// goroutines at once when their deadlines came, and statsd's peak RSS went
// to 264 MiB. A refused stream that reaches an interceptor ends as every
// stream does, its context cancelled; its goroutine lives for the refusal
// only, and gRPC serves at most 16 streams per connection.
func (s *StatsService) ServerOptions() []grpc.ServerOption {
	gate := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, readsPrefix) {
			return handler(ctx, req)
		}
		g := s.gate
		if err := g.enter(); err != nil {
			return nil, err
		}
		defer g.leave()
		return handler(ctx, req)
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

// maxFlights is the most discovery flights whose reads are in flight at
// once for each include_host: a caller that cannot join one (its reads
// must end sooner) leads a flight of its own only while fewer are reading,
// and otherwise joins the one whose reads end soonest, its own deadline
// standing (a flight whose reads are done, building its answer, reads
// nothing more and takes no member: it does not count). Without it a
// reader sending shrinking or random deadlines started a flight, each
// reading every binding, with most calls.
const maxFlights = 2

// activeShare holds the flights callers may join, by include_host (those
// whose reads are in flight: at most maxFlights each), and the flights
// whose encoded answer members' streams have yet to send.
type activeShare struct {
	mu      sync.Mutex
	open    [2][]*activeFlight
	sending map[*sandboxstatsv1.StatsActiveWorkloadsResponse]*activeFlight
}

// shared answers a discovery read from a flight open for includeHost whose
// reads the caller can wait for (the one ending soonest), else from a
// flight of its own (which later callers join) if fewer than maxFlights are
// reading, else from the open flight whose reads end soonest, the caller's
// own deadline standing. A flight is built by build (given the bound of
// each read and a func that closes the flight to joiners, to call before
// the answer's state is taken). A member whose context ends first gets its
// context's status; the flight goes on for the others.
//
// A caller joined to a flight that reads longer than it may wait gets the
// flight's whole answer or its own DEADLINE_EXCEEDED, never an answer cut
// at its deadline: that would be an answer per member, built from a
// flight's reads in flight (each member's own snapshot, pending entries and
// encoding), a second answer path beside the one shared answer and its
// safety argument.
func (s *StatsService) shared(ctx context.Context, includeHost bool, build func(ctx context.Context, bound time.Duration, closeJoin func()) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error)) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	key := 0
	if includeHost {
		key = 1
	}
	bound := s.readBound(ctx)
	readsEnd := time.Now().Add(bound)
	s.share.mu.Lock()
	var f *activeFlight
	for _, o := range s.share.open[key] {
		if !o.readsEnd.After(readsEnd) && (f == nil || o.readsEnd.Before(f.readsEnd)) {
			f = o
		}
	}
	if f == nil && len(s.share.open[key]) >= maxFlights {
		// No flight it can wait for, and no room for another: it joins
		// the one whose reads end soonest, and its own deadline may come
		// first (DEADLINE_EXCEEDED: reads are done in milliseconds unless
		// a source hangs). Refusing it failed a legitimate poller now and
		// then (TestIntegrationLoad: 1 in 411,668).
		for _, o := range s.share.open[key] {
			if f == nil || o.readsEnd.Before(f.readsEnd) {
				f = o
			}
		}
	}
	switch {
	case f == nil:
		f = &activeFlight{readsEnd: readsEnd, done: make(chan struct{}), unsent: 1}
		s.share.open[key] = append(s.share.open[key], f)
		s.share.mu.Unlock()
		s.lead(ctx, key, f, bound, build)
	default:
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
		s.share.open[key] = slices.DeleteFunc(s.share.open[key], func(o *activeFlight) bool { return o == f })
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

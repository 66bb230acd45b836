package sweep

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Status is the outcome of polling one daemon.
type Status string

const (
	// StatusOK: the daemon answered with at least one sample.
	StatusOK Status = "ok"
	// StatusNoSample: the daemon answered with no sample (idle, or its
	// workload not measurable yet); NoSampleReason says which.
	StatusNoSample Status = "no-sample"
	// StatusVanished: the socket was gone by the time it was polled (the
	// daemon exited); skipped, not an error.
	StatusVanished Status = "vanished"
	// StatusError: the call failed; Code and Err say how.
	StatusError Status = "error"
	// StatusSkipped: not polled: the sweep's bound (Config.SweepTimeout)
	// ran out before a slot was free for it.
	StatusSkipped Status = "skipped"
)

// DaemonResult is what one daemon answered in one sweep.
type DaemonResult struct {
	// Socket is the daemon's Unix socket path, as found by the glob.
	Socket string
	Status Status
	// Samples as the daemon returned them (StatusOK).
	Samples []*sandboxstatsv1.WorkloadStatsSample
	// Pending are the daemon's bound workloads without a sample in its
	// answer, each with why (StatusOK and StatusNoSample).
	Pending []*sandboxstatsv1.PendingWorkload
	// NoSampleReason and NoSampleDetail explain StatusNoSample.
	NoSampleReason sandboxstatsv1.NoSampleReason
	NoSampleDetail string
	// Code is the gRPC code of a failed call (StatusError, StatusVanished).
	Code codes.Code
	// Err is the failure (StatusError, StatusVanished, StatusSkipped),
	// naming the socket.
	Err error
	// Took is the wall time of the poll, dial included.
	Took time.Duration
	// DriftFindings are the daemon's open drift findings, fetched with a
	// second call (ListDriftFindings) on the same connection, within the
	// same per-call deadline, when a sample says it has some, and when the
	// daemon produced no sample for a reason drift may explain: it answered
	// NOT_MEASURABLE_YET, or the call failed DeadlineExceeded or Internal,
	// or was refused TOO_MANY_READS (a busy statsd; asked once more after a
	// short pause first) (not for NO_WORKLOAD, a vanished daemon or a
	// refused connection).
	DriftFindings []*sandboxstatsv1.DriftFinding
	// DriftErr is why that second call failed or was not made (out of
	// time), or why its findings were dropped (over Limits.MaxFindings);
	// the samples still count.
	DriftErr error
	// Ended are the activations that ended at the daemon recently, oldest
	// first, every page of them: those StatsActiveWorkloads carried, then
	// the pages ListEndedActivations gave for its token (a sample of an
	// activation whose record came in a later page is dropped from Samples:
	// it ended between the calls); or, when StatsActiveWorkloads failed (a
	// hung or failing read of the current workload), every page of
	// ListEndedActivations. All within the poll's deadline.
	Ended []*sandboxstatsv1.EndedActivation
	// EndedErr is why a ListEndedActivations call failed (Ended holds the
	// pages before it; the rest is read at the next sweep), or why the
	// ended activations were dropped whole (over Limits.MaxEnded records or
	// pages, or Limits.MaxReplyBytes bytes of pages).
	EndedErr error
	// EndedLog is the daemon's ended log as of the first answer that
	// carried its records (StatsActiveWorkloads', or ListEndedActivations'
	// first page): its lowest_sequence is the oldest record held then, so a
	// reader that had read up to a lower sequence knows what was dropped
	// before it read it. Nil from a statsd older than the log, or when no
	// answer came.
	EndedLog *sandboxstatsv1.EndedLog
	// Capped lists the parts of the answer dropped whole for being over
	// their cap: "samples" (then the result is an error,
	// ResourceExhausted), "pending" (over Limits.MaxSamples entries),
	// "drift-findings", "ended", "reply-bytes" (an
	// answer over Limits.MaxReplyBytes: an error, ResourceExhausted; not a
	// busy statsd's refusal, ResourceExhausted with the reason
	// TOO_MANY_READS, which is a poll error only).
	Capped []string
	// PeerRefused: the server's uid (SO_PEERCRED) is not an allowed one;
	// nothing was sent to it (an error, PermissionDenied).
	PeerRefused bool
}

// Limits bound what one daemon's answer may hold, so that a daemon that is
// not statsd (or a broken one) cannot grow a poller's memory or its
// export. A part over its limit is dropped whole, never cut to its first N
// (which N would be the daemon's choice). A zero field takes the value of
// DefaultLimits.
type Limits struct {
	// MaxSamples: samples of one StatsActiveWorkloads answer (statsd serves
	// at most 64 workloads, --max-workloads), and of one poll with those
	// read on their own (ANSWER_FULL).
	MaxSamples int
	// MaxFindings: open drift findings of one ListDriftFindings answer.
	MaxFindings int
	// MaxEnded: ended activations of one daemon in one sweep, every page
	// together (statsd keeps at most --ended-max, 64 by default, in pages
	// of at least one), and so the most pages read.
	MaxEnded int
	// MaxReplyBytes: the largest message received from a daemon
	// (grpc.MaxCallRecvMsgSize; gRPC's own default is 4 MiB), and the most
	// bytes of a daemon's answers read in one sweep once they are paged
	// (StatsActiveWorkloads with an ended_next_page_token, and every page
	// after it; statsd's ended records are under 1 MiB in all, its file's
	// cap).
	MaxReplyBytes int
}

// DefaultLimits are the limits of a Config that sets none.
var DefaultLimits = Limits{MaxSamples: 64, MaxFindings: 256, MaxEnded: 256, MaxReplyBytes: 1 << 20}

func (l Limits) orDefault() Limits {
	pick := func(v, def int) int {
		if v <= 0 {
			return def
		}
		return v
	}
	return Limits{
		MaxSamples:    pick(l.MaxSamples, DefaultLimits.MaxSamples),
		MaxFindings:   pick(l.MaxFindings, DefaultLimits.MaxFindings),
		MaxEnded:      pick(l.MaxEnded, DefaultLimits.MaxEnded),
		MaxReplyBytes: pick(l.MaxReplyBytes, DefaultLimits.MaxReplyBytes),
	}
}

// Config is how a sweep polls.
type Config struct {
	// Concurrency is the most daemons polled at once (at least 1).
	Concurrency int
	// Timeout bounds each daemon's poll (0: only the context and the
	// sweep's bound do).
	Timeout time.Duration
	// SweepTimeout bounds the whole sweep (0: no bound): a daemon whose
	// poll could not start within it is StatusSkipped, one in flight is cut
	// at it.
	SweepTimeout time.Duration
	// Limits bound each daemon's answer.
	Limits Limits
	// AllowUIDs are the uids a socket's owner, and the server behind it
	// (SO_PEERCRED), may have; nil: DefaultAllowedUIDs.
	AllowUIDs []uint32
}

// Sweep discovers the daemons matching glob and polls each once with
// StatsActiveWorkloads, at most concurrency at a time (at least 1), each
// call under its own perCallTimeout, with the default Config otherwise
// (see Config.Sweep).
func Sweep(ctx context.Context, glob string, concurrency int, perCallTimeout time.Duration) ([]DaemonResult, error) {
	return Config{Concurrency: concurrency, Timeout: perCallTimeout}.Sweep(ctx, glob)
}

// PollAll polls the given sockets as Sweep does.
func PollAll(ctx context.Context, sockets []string, concurrency int, perCallTimeout time.Duration) []DaemonResult {
	return Config{Concurrency: concurrency, Timeout: perCallTimeout}.PollAll(ctx, sockets)
}

// Sweep discovers the daemons matching glob (DiscoverAllowed with
// c.AllowUIDs) and polls them (PollAll). It returns one result per socket,
// sorted by socket path; the error is only for a malformed glob. A hung
// daemon costs its own timeout and holds one of the concurrency slots
// meanwhile; the others proceed.
func (c Config) Sweep(ctx context.Context, glob string) ([]DaemonResult, error) {
	d, err := DiscoverAllowed(glob, c.AllowUIDs)
	if err != nil {
		return nil, err
	}
	return c.PollAll(ctx, d.Sockets), nil
}

// PollAll polls the given sockets, in their order, at most c.Concurrency at
// a time, each on a fresh connection closed after its poll, and returns one
// result per socket (results[i] is sockets[i]'s). Past c.SweepTimeout the
// polls in flight are cut and the daemons not yet polled are StatusSkipped.
// A Pool polls the same way on connections it keeps.
func (c Config) PollAll(ctx context.Context, sockets []string) []DaemonResult {
	return c.pollAll(ctx, sockets, c.poller().pollOnce)
}

// pollAll polls each socket with poll under c's bounds (see PollAll).
func (c Config) pollAll(ctx context.Context, sockets []string, poll func(context.Context, string) DaemonResult) []DaemonResult {
	sctx := ctx
	// over reports the sweep's bound past by the clock: sctx.Err() is set
	// by a timer that can run late, and a poll started meanwhile failed at
	// once (DeadlineExceeded) without a call, counted as polled.
	over := func() bool { return sctx.Err() != nil }
	if c.SweepTimeout > 0 {
		var cancel context.CancelFunc
		end := time.Now().Add(c.SweepTimeout)
		sctx, cancel = context.WithDeadline(ctx, end)
		defer cancel()
		over = func() bool { return sctx.Err() != nil || !time.Now().Before(end) }
	}
	p := c.poller()
	results := make([]DaemonResult, len(sockets))
	// A fixed set of workers rather than a goroutine per daemon: each
	// grows its stack to a poll's depth once, not once per daemon.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(max(c.Concurrency, 1), len(sockets)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(sockets) {
					return
				}
				sock := sockets[i]
				if ctx.Err() == nil && over() {
					results[i] = DaemonResult{Socket: sock, Status: StatusSkipped,
						Err: fmt.Errorf("sweep: %s not polled: the sweep's bound of %v ran out", sock, c.SweepTimeout)}
					continue
				}
				results[i] = p.pollDaemon(sctx, sock, poll)
			}
		})
	}
	wg.Wait()
	return results
}

package sweep

// This file reads on its own each workload a discovery answer had no room
// for: statsd lists it in pending as ANSWER_FULL ("read it with
// StatsWorkload"). Its 56 KiB answer shares its bytes among the bindings,
// and a sample of a real v1 cgroup (about 1.1 KiB, its absent list the
// most of it) has nothing left to cut below that: 64 such workloads (statsd
// --max-workloads' ceiling) leave about a third of them out of every
// answer.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// answerFullReads is the most StatsWorkload calls in flight at once for one
// daemon's ANSWER_FULL workloads: a few, so that a slow one does not hold the
// rest, and far below statsd's --max-reads (64).
const answerFullReads = 4

// maxPendingDetail bounds a pending entry's detail once a failed read on
// its own is added to it (statsd bounds its own to 1 KiB); the read's error
// is cut to maxReadError first, so a long detail never pushes it out.
const (
	maxPendingDetail = 1<<10 + 256
	maxReadError     = 256
)

// maxAnswerFullReply bounds one StatsWorkload answer read on its own:
// statsd caps a sample, its host view and baseline included, at 24 KiB on
// the wire (internal/server's maxSampleBytes), with room for the answer's
// own framing. gRPC refuses a larger message before it is held.
const maxAnswerFullReply = 32 << 10

// answerFullReadTimeout bounds one read on its own (statsd's default read
// timeout is 2 s): one slow workload holds a read slot no longer.
const answerFullReadTimeout = 2500 * time.Millisecond

// readAnswerFull reads with StatsWorkload, on client under ctx, each
// workload of pending listed as ANSWER_FULL, while the samples number fewer
// than Limits.MaxSamples and the bytes read (used so far, the answer's)
// stay within Limits.MaxReplyBytes. It returns the samples with those read
// (sorted by actor uid, as an answer's), the pending entries left (one not
// read keeps its entry, the failure added to its detail), and "reply-bytes"
// when that bound left some unread. A sample is kept
// only when it names the actor asked.
func (p poller) readAnswerFull(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient,
	samples []*sandboxstatsv1.WorkloadStatsSample, pending []*sandboxstatsv1.PendingWorkload, used int,
) ([]*sandboxstatsv1.WorkloadStatsSample, []*sandboxstatsv1.PendingWorkload, []string) {
	var full []int // indices into pending
	seen := make(map[string]bool, len(samples)+len(pending))
	for _, s := range samples {
		seen[s.GetActorUid()] = true
	}
	for i, pw := range pending {
		uid := pw.GetIdentity().GetActorUid()
		if pw.GetReason() == sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL && uid != "" && !seen[uid] {
			seen[uid] = true // an id listed twice, or sampled already, is read once at most
			full = append(full, i)
		}
	}
	full = full[:min(len(full), max(p.limits.MaxSamples-len(samples), 0))]
	if len(full) == 0 {
		return samples, pending, nil
	}
	type result struct {
		sample *sandboxstatsv1.WorkloadStatsSample
		err    error
	}
	results := make([]result, len(full))
	// The reads get half of what is left of the poll: drift and the ended
	// pages, asked after them, keep the rest.
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		defer cancel()
	}
	// The reply bytes left, reserved before each read (at most
	// maxAnswerFullReply a read) and given back once its size is known: what
	// a daemon can make the poll hold stays within Limits.MaxReplyBytes.
	// A read that finds nothing left while others hold reservations waits
	// for them to give back what they did not use.
	var (
		budgetMu sync.Mutex
		returned = sync.NewCond(&budgetMu)
		budget   = p.limits.MaxReplyBytes - used
		reserved int // reads holding a reservation
	)
	reserve := func() int {
		budgetMu.Lock()
		defer budgetMu.Unlock()
		for budget <= 0 && reserved > 0 {
			returned.Wait()
		}
		n := min(budget, maxAnswerFullReply)
		if n <= 0 {
			return 0
		}
		budget -= n
		reserved++
		return n
	}
	settle := func(room, size int) {
		budgetMu.Lock()
		budget += room - size
		reserved--
		budgetMu.Unlock()
		returned.Broadcast()
	}
	var overBudget atomic.Bool
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(answerFullReads, len(full)) {
		wg.Go(func() {
			for {
				j := int(next.Add(1) - 1)
				if j >= len(full) {
					return
				}
				uid := pending[full[j]].GetIdentity().GetActorUid()
				room := reserve()
				if room == 0 {
					overBudget.Store(true)
					results[j].err = fmt.Errorf("over the poll's %d reply bytes: not read", p.limits.MaxReplyBytes)
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, answerFullReadTimeout)
				resp, err := client.StatsWorkload(rctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: uid}, grpc.MaxCallRecvMsgSize(room))
				cancel()
				size := 0
				switch {
				case err != nil && tooLarge(err):
					overBudget.Store(true)
					results[j].err = fmt.Errorf("over the poll's %d reply bytes (room left %d): %w", p.limits.MaxReplyBytes, room, err)
				case err != nil:
					results[j].err = fmt.Errorf("sweep: StatsWorkload %q: %w", foreign.Bound(uid, 64), err)
				case resp.GetSample() == nil:
					results[j].err = fmt.Errorf("sweep: StatsWorkload %q answered no sample", foreign.Bound(uid, 64))
				case resp.GetSample().GetActorUid() != uid:
					results[j].err = fmt.Errorf("sweep: StatsWorkload %q answered a sample of actor %q", foreign.Bound(uid, 64), foreign.Bound(resp.GetSample().GetActorUid(), 64))
				default:
					results[j].sample = resp.GetSample()
					size = proto.Size(resp.GetSample())
				}
				settle(room, size)
			}
		})
	}
	wg.Wait()
	var capped []string
	if overBudget.Load() {
		capped = append(capped, "reply-bytes")
	}
	samples = slices.Clone(samples) // the answer's own stays as it came
	read := make(map[int]bool, len(full))
	for j, i := range full {
		r := results[j]
		if r.err == nil {
			samples = append(samples, r.sample)
			read[i] = true
			continue
		}
		why := foreign.Bound(r.err.Error(), maxReadError)
		pending[i].Detail = foreign.Bound(pending[i].GetDetail(), maxPendingDetail-len(why)-len("; read on its own: ")) + "; read on its own: " + why
	}
	if len(read) > 0 {
		slices.SortStableFunc(samples, func(a, b *sandboxstatsv1.WorkloadStatsSample) int {
			return strings.Compare(a.GetActorUid(), b.GetActorUid())
		})
		kept := make([]*sandboxstatsv1.PendingWorkload, 0, len(pending)-len(read))
		for i, pw := range pending {
			if !read[i] {
				kept = append(kept, pw)
			}
		}
		pending = kept
	}
	return samples, pending, capped
}

// tooLarge reports whether err is gRPC's refusal of a reply above the
// call's receive limit (grpc-go: "grpc: received message larger than max
// (N vs. M)", code ResourceExhausted; a daemon that sends that text as its
// own error only marks its poll "reply-bytes").
func tooLarge(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max")
}

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

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// answerFullReads is the most StatsWorkload calls in flight at once for one
// daemon's ANSWER_FULL workloads: a few, so that a slow one does not hold the
// rest, and far below statsd's --max-reads (64).
const answerFullReads = 4

// maxPendingDetail bounds a pending entry's detail once a failed read on
// its own is added to it (statsd bounds its own to 1 KiB).
const maxPendingDetail = 1<<10 + 256

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
	for i, pw := range pending {
		if pw.GetReason() == sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL && pw.GetIdentity().GetActorUid() != "" {
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
				resp, err := client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: uid})
				switch {
				case err != nil:
					results[j].err = err
				case resp.GetSample().GetActorUid() != uid:
					results[j].err = fmt.Errorf("StatsWorkload answered a sample of actor %q", foreign.Bound(resp.GetSample().GetActorUid(), 64))
				default:
					results[j].sample = resp.GetSample()
				}
			}
		})
	}
	wg.Wait()
	var capped []string
	samples = slices.Clone(samples) // the answer's own stays as it came
	read := make(map[int]bool, len(full))
	for j, i := range full {
		r := results[j]
		if r.err == nil {
			if n := proto.Size(r.sample); used+n > p.limits.MaxReplyBytes {
				r.err = fmt.Errorf("over the poll's %d reply bytes", p.limits.MaxReplyBytes)
				if !slices.Contains(capped, "reply-bytes") {
					capped = append(capped, "reply-bytes")
				}
			} else {
				used += n
				samples = append(samples, r.sample)
				read[i] = true
				continue
			}
		}
		pending[i].Detail = foreign.Bound(pending[i].GetDetail()+"; read on its own: "+r.err.Error(), maxPendingDetail)
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

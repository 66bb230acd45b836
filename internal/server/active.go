package server

// This file is the discovery read over several bindings: every bound
// workload is read at once (at most identity.LimitMaxWorkloads reads, each
// source sharing its own reads in flight), each under its own bound, and
// the answer's bytes are shared fairly among them.

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

const (
	// endedReserve is what the samples and pending entries of a discovery
	// answer leave of its page for the ended records at least (the first
	// record always goes in, whatever its size; the rest is paged).
	endedReserve = 8 << 10
	// maxPendingDetail bounds a pending entry's detail; cutPendingDetail is
	// what each is cut to when the pending entries would take more than
	// half the page.
	maxPendingDetail = 1 << 10
	cutPendingDetail = 96
)

// activeResult is what the discovery read got for one binding.
type activeResult struct {
	b      *identity.Binding
	sample *sandboxstatsv1.WorkloadStatsSample
	err    error
}

// StatsActiveWorkloads is the discovery read: every normal state is an
// answer. Each bound workload is read at once under the read bound
// (readBound); one that yields no sample is listed in pending with why.
// Callers asking while an answer's reads are in flight share it (shared);
// the reads served at once are bounded by the read gate (ServerOptions).
func (s *StatsService) StatsActiveWorkloads(ctx context.Context, req *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	includeHost := req.GetIncludeHost()
	return s.shared(ctx, includeHost, func(ctx context.Context, bound time.Duration, closeJoin func()) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
		return s.activeAnswer(ctx, includeHost, bound, closeJoin)
	})
}

// activeAnswer builds a discovery answer: each binding read under bound,
// then closeJoin, then the answer of the state after the reads.
func (s *StatsService) activeAnswer(ctx context.Context, includeHost bool, bound time.Duration, closeJoin func()) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	bindings, _ := s.store.Snapshot()
	// Every binding is read at once, each under its own bound: a hung
	// one holds nobody else's time.
	results := make([]activeResult, len(bindings))
	if len(bindings) == 1 {
		results[0] = s.readOne(ctx, bindings[0], includeHost, bound)
	} else {
		var wg sync.WaitGroup
		for i, b := range bindings {
			wg.Go(func() { results[i] = s.readOne(ctx, b, includeHost, bound) })
		}
		wg.Wait()
	}
	closeJoin()
	// The answer is the state after the reads: a binding that ended or was
	// replaced meanwhile is not in it and gives no sample (its record is
	// among the ended ones, or its successor is pending), so a sample never
	// stands beside its own record; a read that saw its binding change
	// (errBindingChanged) is of such a binding.
	now, ended := s.store.Snapshot()
	if len(now) == 0 {
		return s.withEndedLog(noWorkload(), ended), nil
	}
	resp := &sandboxstatsv1.StatsActiveWorkloadsResponse{}
	read := make(map[*identity.Binding]activeResult, len(results))
	bindingOf := make(map[*sandboxstatsv1.WorkloadStatsSample]*identity.Binding, len(results))
	for _, r := range results {
		read[r.b] = r
	}
	for _, b := range now {
		r, ok := read[b]
		switch {
		case !ok:
			resp.Pending = append(resp.Pending, pendingOf(b, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED,
				"bound while the answer was being read"))
		case r.err != nil:
			_, reason := readReason(r.err)
			resp.Pending = append(resp.Pending, pendingOf(b, reason, r.err.Error()))
		default:
			resp.Samples = append(resp.Samples, r.sample)
			bindingOf[r.sample] = b
		}
	}
	// One sample and one ended record always fit a page (budget.go): the
	// first record is measured (converted once more) only beside several.
	reserve := endedReserve
	if len(ended) > 0 && len(resp.Samples)+len(resp.Pending) > 1 {
		first, _ := endedPage(ended, 0, 0, activeEndedField)
		if len(first) == 1 {
			reserve = max(reserve, protowire.SizeTag(activeEndedField)+protowire.SizeBytes(proto.Size(first[0])))
		}
	}
	shareAnswer(resp, reserve, func(s *sandboxstatsv1.WorkloadStatsSample) *identity.Binding { return bindingOf[s] })
	if len(resp.Samples) == 0 {
		resp.NoSampleReason = sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET
		resp.NoSampleDetail = "no bound workload could be read: see pending"
		if len(resp.Pending) == 1 {
			resp.NoSampleDetail = resp.Pending[0].Detail
		}
	}
	return s.withEndedLog(resp, ended), nil
}

// readOne reads b for the discovery read, under bound from now.
func (s *StatsService) readOne(ctx context.Context, b *identity.Binding, includeHost bool, bound time.Duration) activeResult {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	sample, err := s.sample(ctx, b, includeHost, false)
	return activeResult{b: b, sample: sample, err: err}
}

// readBound is how long each read of a discovery read may take: the read
// timeout, and at most three quarters of what is left before the caller's
// deadline, so the answer (with a hung neighbour's pending entry) reaches
// the caller in time.
func (s *StatsService) readBound(ctx context.Context) time.Duration {
	bound := s.store.ReadTimeout()
	if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(dl)*3/4)
	}
	return bound
}

func pendingOf(b *identity.Binding, reason sandboxstatsv1.ErrorReason, detail string) *sandboxstatsv1.PendingWorkload {
	return &sandboxstatsv1.PendingWorkload{
		Identity:      identityToProto(b.Identity),
		SandboxClass:  classToProto(b.Ref.Class),
		EpochUnixNano: b.EpochUnixNano,
		Reason:        reason,
		Detail:        foreign.Bound(detail, maxPendingDetail),
	}
}

// The field numbers of StatsActiveWorkloadsResponse's samples and pending.
const (
	activeSamplesField = 1
	activePendingField = 6
)

// shareAnswer keeps r's samples and pending entries within what the page
// leaves them beside reserve bytes of ended records, shared fairly. Pending
// entries take at most half of it: over that, their details are cut, then
// their identities to the actor uid (each cut named in the detail). A
// sample under its share of the rest is kept whole and leaves the rest to
// the others; one over its share is cut to it (each cut named in its absent
// list); one that still does not fit moves to pending (ANSWER_FULL), the
// largest first. One binding cannot starve the rest.
func shareAnswer(r *sandboxstatsv1.StatsActiveWorkloadsResponse, reserve int, bindingOf func(*sandboxstatsv1.WorkloadStatsSample) *identity.Binding) {
	page := pageBytes - maxTokenField - reserve
	pendingBytes := func() int {
		n := 0
		for _, p := range r.Pending {
			n += protowire.SizeTag(activePendingField) + protowire.SizeBytes(proto.Size(p))
		}
		return n
	}
	cutPending(r.Pending, pendingBytes, page/2)
	budget := func() int { return page - pendingBytes() }
	wire := func(s *sandboxstatsv1.WorkloadStatsSample) int {
		return protowire.SizeTag(activeSamplesField) + protowire.SizeBytes(proto.Size(s))
	}
	sizes := make([]int, len(r.Samples))
	total := 0
	for i, s := range r.Samples {
		sizes[i] = wire(s)
		total += sizes[i]
	}
	if total <= budget() {
		return
	}
	// The fair share: the smallest samples are kept whole while they are
	// under an equal split of what is left.
	order := make([]int, len(r.Samples))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return sizes[a] - sizes[b] })
	left, n, share := budget(), len(order), 0
	for _, i := range order {
		share = left / n
		if sizes[i] > share {
			break
		}
		left -= sizes[i]
		n--
	}
	for i, s := range r.Samples {
		if sizes[i] > share {
			// The share is the wire size; the cap is the message's.
			capSampleTo(s, max(share-protowire.SizeTag(activeSamplesField)-3, 0), "the sample (its fair share of a StatsActiveWorkloads answer)")
		}
	}
	for {
		total = 0
		largest := -1
		for i, s := range r.Samples {
			sizes[i] = wire(s)
			total += sizes[i]
			if largest < 0 || sizes[i] > sizes[largest] {
				largest = i
			}
		}
		if total <= budget() || largest < 0 {
			break
		}
		r.Pending = append(r.Pending, pendingOf(bindingOf(r.Samples[largest]), sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL,
			"cut: the sample did not fit its share of the answer even with every cut; read it with StatsWorkload"))
		r.Samples = slices.Delete(r.Samples, largest, largest+1)
		sizes = sizes[:len(r.Samples)]
		cutPending(r.Pending, pendingBytes, page/2)
	}
	slices.SortFunc(r.Pending, func(a, b *sandboxstatsv1.PendingWorkload) int {
		return strings.Compare(a.GetIdentity().GetActorUid(), b.GetIdentity().GetActorUid())
	})
}

// cutPending cuts the pending entries while size() is over limit: first
// every detail to cutPendingDetail bytes, then every identity to its actor
// uid; each cut says so in the detail.
func cutPending(pending []*sandboxstatsv1.PendingWorkload, size func() int, limit int) {
	if size() <= limit {
		return
	}
	for _, p := range pending {
		if len(p.Detail) > cutPendingDetail {
			p.Detail = foreign.Bound(p.Detail, cutPendingDetail)
		}
	}
	if size() <= limit {
		return
	}
	for _, p := range pending {
		if id := p.GetIdentity(); proto.Size(id) > len(id.GetActorUid())+3 {
			p.Identity = &sandboxstatsv1.WorkloadIdentity{ActorUid: id.GetActorUid()}
			p.Detail = foreign.Bound("cut: identity to its actor uid; "+p.Detail, cutPendingDetail+48)
		}
	}
}

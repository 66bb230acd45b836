package server

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// maximalEnded is the i-th of a run of records each as large as a record
// gets: an identity at every length limit, a 1 KiB final reason, and a
// final sample (with its baseline) just under maxSampleBytes.
func maximalEnded(t testing.TB, i int) *identity.Ended {
	t.Helper()
	name := func(p string, n int) string { return p + strings.Repeat("n", n-len(p)) }
	u64 := uint64(math.MaxUint64)
	r := source.Reading{Kind: source.KindGuestAgent, Detail: name("detail", 256), MemoryCurrentBytes: u64, MemoryWorkingSetBytes: u64,
		CPUUsageUsec: &u64, Throttling: &source.CPUThrottling{Periods: &u64, ThrottledPeriods: &u64, ThrottledUsec: &u64}}
	base := source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: &u64}
	e := &identity.Ended{
		Identity: identity.Identity{ActorUID: name(fmt.Sprintf("actor-%03d-", i), 128), ActorName: name("a", 253), ActorNamespace: name("b", 253),
			TemplateNamespace: name("c", 253), TemplateName: name("d", 253)},
		Class: source.ClassMicroVM, EpochUnixNano: fixedNow.UnixNano() + int64(i)*1e9, EndUnixNano: fixedNow.UnixNano() + int64(i)*1e9 + 5e8,
		Outcome: identity.OutcomeSandboxDead, Provenance: identity.ProvenanceLastGoodPoll, FinalAgeNanos: math.MaxInt64,
		FinalReason: name("final reason ", 1024), Final: &r, FinalAtUnixNano: math.MaxInt64,
		Baseline:  &identity.Baseline{Kind: identity.BaselineFirstRead, AtUnixNano: math.MaxInt64, FirstRead: &base},
		PeakBytes: &u64, PeakIsLowerBound: true, BaselineDelayNanos: math.MaxInt64,
		Absent: []source.Absent{{Field: "cpu_usec", Reason: name("reason ", 200)}},
	}
	// Pad the final with absent reasons of 128 bytes (what the text cut
	// leaves) until one more would put it over the cap.
	for {
		r.Absent = append(r.Absent, source.Absent{Field: "memory_signals.limit_bytes", Reason: name("pad ", maxCutReason)})
		if proto.Size(endedToProto(e).GetFinal()) > maxSampleBytes {
			r.Absent = r.Absent[:len(r.Absent)-1]
			return e
		}
	}
}

// pager reads the ended activations a page at a time, as a client does,
// and checks each page.
type pager struct {
	t       *testing.T
	reached map[string]int // record key -> times reached
	pages   int
	largest int
}

func keyOf(e *sandboxstatsv1.EndedActivation) string {
	return fmt.Sprintf("%s/%d", e.GetIdentity().GetActorUid(), e.GetEpochUnixNano())
}

func endedKey(e *identity.Ended) string {
	return fmt.Sprintf("%s/%d", e.Identity.ActorUID, e.EpochUnixNano)
}

// page takes one page of list after token and returns the next token.
func (p *pager) page(list []*identity.Ended, token string) string {
	p.t.Helper()
	resp, err := listEndedPage(list, token)
	if err != nil {
		p.t.Fatal(err)
	}
	p.took(resp.GetEnded(), proto.Size(resp))
	if len(list) > 0 && len(resp.GetEnded()) == 0 {
		p.t.Fatalf("page %d is empty with %d records kept", p.pages, len(list))
	}
	return resp.GetNextPageToken()
}

func (p *pager) took(ended []*sandboxstatsv1.EndedActivation, size int) {
	p.t.Helper()
	p.pages++
	p.largest = max(p.largest, size)
	if size >= maxResponseBytes {
		p.t.Errorf("page %d: %d bytes, not under %d", p.pages, size, maxResponseBytes)
	}
	for _, e := range ended {
		p.reached[keyOf(e)]++
	}
}

// check holds that no record was reached twice, that every record of
// last (the list when the last page was read) was reached, and that a
// record never reached was dropped (it is in none of last).
func (p *pager) check(all []*identity.Ended, last []*identity.Ended) {
	p.t.Helper()
	inLast := map[string]bool{}
	for _, e := range last {
		inLast[endedKey(e)] = true
	}
	unreached := 0
	for _, e := range all {
		k := endedKey(e)
		switch n := p.reached[k]; {
		case n > 1:
			p.t.Errorf("record %.20s reached %d times", k, n)
		case n == 0 && inLast[k]:
			p.t.Errorf("record %.20s kept to the end but never reached", k)
		case n == 0:
			unreached++
		}
	}
	p.t.Logf("%d records made, %d reached once in %d pages (largest %d bytes), %d dropped before the pages reached them",
		len(all), len(p.reached), p.pages, p.largest, unreached)
}

// TestEndedPagesMaximalRecords: 64 records of the largest size are read in
// pages under 64 KiB, every record once, also while records are added and
// dropped (oldest first, as identity does) between pages.
func TestEndedPagesMaximalRecords(t *testing.T) {
	for _, tc := range []struct {
		name         string
		add, dropOld int // between pages: records added (the oldest dropped past 64), records dropped for age
		addPages     int // pages after which records are added (0: all)
		wantUnreach  bool
	}{
		{name: "still"},
		{name: "one added a page", add: 1},
		{name: "one dropped for age a page", dropOld: 1},
		// The oldest records are dropped faster than pages of two are read:
		// some leave before the pages reach them, and the page after a
		// token whose record left starts at the oldest kept.
		{name: "three added a page for 8 pages", add: 3, addPages: 8, wantUnreach: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var all, list []*identity.Ended
			next := 0
			add := func(n int) {
				for range n {
					e := maximalEnded(t, next)
					next++
					all, list = append(all, e), append(list, e)
				}
				list = list[max(len(list)-identity.DefaultEndedMax, 0):]
			}
			add(identity.DefaultEndedMax)
			p := &pager{t: t, reached: map[string]int{}}
			token := p.page(list, "")
			for token != "" {
				if tc.addPages == 0 || p.pages <= tc.addPages {
					add(tc.add)
				}
				list = list[min(tc.dropOld, len(list)):]
				token = p.page(list, token)
				if p.pages > 1000 {
					t.Fatal("more than 1,000 pages")
				}
			}
			p.check(all, list)
			if tc.wantUnreach == (len(p.reached) == len(all)) {
				t.Errorf("reached %d of %d records", len(p.reached), len(all))
			}
			if tc.name == "still" && p.pages != identity.DefaultEndedMax/2 {
				t.Errorf("%d pages for 64 maximal records, want 32 (two a page)", p.pages)
			}
		})
	}
}

// TestEndedPagesThroughTheStore: StatsActiveWorkloads carries the first
// page of the ended activations and a token for the rest; following the
// tokens with ListEndedActivations, while activations end (and the oldest
// records are dropped past --ended-max) between the calls, reaches every
// record once.
func TestEndedPagesThroughTheStore(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, func(c *identity.Config) {
		c.EndedRetention = 1 << 62 // the harness clock moves a second a call
	})
	r := cgroupRdg
	r.Detail = strings.Repeat("d", 8<<10) // about 8.5 KiB a record: 6 a page
	h.src.set(r, nil)
	var made []string
	cycle := func() {
		h.run(t, identA, gvRef)
		resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: identA.GetActorUid()})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, keyOf(resp.GetEnded()))
	}
	for range identity.DefaultEndedMax {
		cycle()
	}
	p := &pager{t: t, reached: map[string]int{}}
	active, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p.took(active.GetEnded(), proto.Size(active))
	if len(active.GetEnded()) == 0 || active.GetEndedNextPageToken() == "" {
		t.Fatalf("StatsActiveWorkloads carries %d records and token %q", len(active.GetEnded()), active.GetEndedNextPageToken())
	}
	for token := active.GetEndedNextPageToken(); token != ""; {
		cycle()
		resp, err := h.client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		p.took(resp.GetEnded(), proto.Size(resp))
		token = resp.GetNextPageToken()
	}
	var all, last []*identity.Ended
	for _, k := range made {
		uid, epoch, _ := strings.Cut(k, "/")
		var e identity.Ended
		e.Identity.ActorUID = uid
		fmt.Sscan(epoch, &e.EpochUnixNano)
		all = append(all, &e)
	}
	last = h.store.Ended()
	p.check(all, last)
	if len(p.reached) != len(made) {
		t.Errorf("reached %d of the %d records made", len(p.reached), len(made))
	}
}

// TestBadPageToken: a token the service did not make is INVALID_ARGUMENT
// INVALID_PAGE_TOKEN; one naming a record no longer kept starts at the
// oldest kept.
func TestBadPageToken(t *testing.T) {
	h := newHarness(t)
	for _, tok := range []string{"x", "ZTE6MTI6", pageKey{actorUID: "a\x01b", epoch: 1}.token(), "ZTE6YWJjOmFjdG9y"} {
		_, err := h.client.ListEndedActivations(context.Background(), &sandboxstatsv1.ListEndedActivationsRequest{PageToken: tok})
		wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN)
	}
	h.run(t, identA, gvRef)
	if _, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.client.ListEndedActivations(context.Background(), &sandboxstatsv1.ListEndedActivationsRequest{PageToken: pageKey{actorUID: "gone", epoch: 1}.token()})
	if err != nil || len(resp.GetEnded()) != 1 || resp.GetNextPageToken() != "" {
		t.Fatalf("a token of a record gone: %v, %v; want the one record kept", resp, err)
	}
}

// TestActiveAnswerWithMaximalParts: a StatsActiveWorkloads answer with a
// sample at its cap (or the longest no-sample detail) and 64 maximal
// records kept carries at least one of them and stays under 64 KiB.
func TestActiveAnswerWithMaximalParts(t *testing.T) {
	var list []*identity.Ended
	for i := range identity.DefaultEndedMax {
		list = append(list, maximalEnded(t, i))
	}
	sample := endedToProto(list[0]).GetFinal()
	for name, r := range map[string]*sandboxstatsv1.StatsActiveWorkloadsResponse{
		"a sample at its cap":           {Samples: []*sandboxstatsv1.WorkloadStatsSample{sample}},
		"no sample, the longest detail": notMeasurableYet(strings.Repeat("x", maxStatusMessage)),
	} {
		r = withEnded(r, list)
		size := proto.Size(r)
		t.Logf("%s: %d bytes, %d records and a token", name, size, len(r.GetEnded()))
		if size >= maxResponseBytes || len(r.GetEnded()) == 0 || r.GetEndedNextPageToken() == "" {
			t.Errorf("%s: %d bytes, %d records, token %q", name, size, len(r.GetEnded()), r.GetEndedNextPageToken())
		}
	}
}

package server

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// endOn runs id and checkpoints it: one ended record.
func (h *harness) endOn(t *testing.T, id *sandboxstatsv1.WorkloadIdentity) *sandboxstatsv1.EndedActivation {
	t.Helper()
	h.run(t, id, gvRef)
	resp, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: id.GetActorUid()})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetEnded()
}

// TestEndedLogOnTheWire: every ended record carries its instance and
// sequence (in the Checkpoint's answer and the readers' alike), and both
// readers' answers carry the log: the instance, the sequences held, the
// evictions. A record one of them listed counts as served when dropped;
// one none listed (the Checkpoint's own answer does not count) is counted
// never served.
func TestEndedLogOnTheWire(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, func(c *identity.Config) { c.EndedMax = 2 })
	instance := h.store.EndedLog().InstanceID

	active := func() *sandboxstatsv1.StatsActiveWorkloadsResponse {
		t.Helper()
		r, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	list := func() *sandboxstatsv1.ListEndedActivationsResponse {
		t.Helper()
		r, err := h.client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := &sandboxstatsv1.EndedLog{InstanceId: instance, LowestSequence: 1, NextSequence: 1}
	if diff := cmp.Diff(want, active().GetEndedLog(), protocmp.Transform()); diff != "" {
		t.Errorf("no record yet: StatsActiveWorkloads' log (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, list().GetEndedLog(), protocmp.Transform()); diff != "" {
		t.Errorf("no record yet: ListEndedActivations' log (-want +got):\n%s", diff)
	}

	a := h.endOn(t, identA) // listed below: served
	if a.GetInstanceId() != instance || a.GetSequence() != 1 {
		t.Fatalf("the Checkpoint's record: instance %q, sequence %d; want %q, 1", a.GetInstanceId(), a.GetSequence(), instance)
	}
	got := list()
	if diff := cmp.Diff(a, got.GetEnded()[0], protocmp.Transform()); diff != "" {
		t.Errorf("the record listed differs from the Checkpoint's (-want +got):\n%s", diff)
	}
	want = &sandboxstatsv1.EndedLog{InstanceId: instance, LowestSequence: 1, NextSequence: 2}
	if diff := cmp.Diff(want, got.GetEndedLog(), protocmp.Transform()); diff != "" {
		t.Errorf("one record: log (-want +got):\n%s", diff)
	}

	h.endOn(t, identB)                                                // #2: read by nobody
	h.endOn(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-c"}) // #3: drops #1 (served)
	h.endOn(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-d"}) // #4: drops #2 (never served)
	want = &sandboxstatsv1.EndedLog{InstanceId: instance, LowestSequence: 3, NextSequence: 5, EvictedMax: 2, EvictedNeverServed: 1}
	r := active()
	if diff := cmp.Diff(want, r.GetEndedLog(), protocmp.Transform()); diff != "" {
		t.Errorf("after two drops: StatsActiveWorkloads' log (-want +got):\n%s", diff)
	}
	var seqs []uint64
	for _, e := range r.GetEnded() {
		seqs = append(seqs, e.GetSequence())
	}
	if diff := cmp.Diff([]uint64{3, 4}, seqs); diff != "" {
		t.Errorf("StatsActiveWorkloads' records (-want +got):\n%s", diff)
	}
	// #3 and #4 were served by that answer: dropping them loses nothing.
	h.endOn(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-e"})
	h.endOn(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-f"})
	want = &sandboxstatsv1.EndedLog{InstanceId: instance, LowestSequence: 5, NextSequence: 7, EvictedMax: 4, EvictedNeverServed: 1}
	if diff := cmp.Diff(want, list().GetEndedLog(), protocmp.Transform()); diff != "" {
		t.Errorf("after dropping two served: log (-want +got):\n%s", diff)
	}
}

// TestAnswerLogLowest: an answer's lowest sequence is that of its first
// record, read before the log; with no record, the log's.
func TestAnswerLogLowest(t *testing.T) {
	l := identity.EndedLog{InstanceID: "i", LowestSequence: 9, NextSequence: 12}
	if got := answerLog(l, []*identity.Ended{{Sequence: 7}, {Sequence: 8}}).GetLowestSequence(); got != 7 {
		t.Errorf("with records from an earlier state: lowest %d, want the first record's 7", got)
	}
	if got := answerLog(l, nil).GetLowestSequence(); got != 9 {
		t.Errorf("with no record: lowest %d, want the log's 9", got)
	}
}

package server

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// A caller that asks for known_absent gets the absent values with a code as
// codes and the rest as before; expanded (api.ExpandKnownAbsent, what
// statsctl does) they are the answer of a caller that did not ask. A value
// whose reason is not its code's word for word stays an AbsentValue.
func TestStatsWorkloadKnownAbsent(t *testing.T) {
	h := newHarness(t)
	r := cgroupRdg
	r.Absent = []source.Absent{
		{Field: "memory_signals.high_bytes", Reason: api.WhyAgentNoHigh},
		{Field: "cpu_throttling.throttled_usec", Reason: "container(s) web: agent \"4.1.0\" reads cpu.stat throttled_time"},
		{Field: "network", Reason: "partial sample: 1 of 2 containers unread"},
		{Field: "block_io", Reason: api.WhyAgentNoBlockIO},
	}
	h.src.set(r, nil)
	h.run(t, identA, gvRef)

	ask := func(known bool) *sandboxstatsv1.WorkloadStatsSample {
		t.Helper()
		resp, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: identA.GetActorUid(), KnownAbsent: known})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSample()
	}
	plain, coded := ask(false), ask(true)
	if len(plain.GetKnownAbsent()) != 0 {
		t.Fatalf("known_absent %v without asking", plain.GetKnownAbsent())
	}
	wantCodes := []sandboxstatsv1.KnownAbsent{sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_HIGH_BYTES, sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_BLOCK_IO}
	if diff := cmp.Diff(wantCodes, coded.GetKnownAbsent()); diff != "" {
		t.Errorf("known_absent (-want +got):\n%s", diff)
	}
	var rest []string
	for _, a := range coded.GetAbsent() {
		rest = append(rest, a.GetField())
	}
	if diff := cmp.Diff([]string{"cpu_throttling.throttled_usec", "network"}, rest); diff != "" {
		t.Errorf("absent fields beside the codes (-want +got):\n%s", diff)
	}
	api.ExpandKnownAbsent(coded)
	byField := protocmp.SortRepeated(func(a, b *sandboxstatsv1.AbsentValue) bool { return a.GetField() < b.GetField() })
	if diff := cmp.Diff(plain, coded, protocmp.Transform(), byField); diff != "" {
		t.Errorf("expanded answer differs from the plain one (-plain +expanded):\n%s", diff)
	}
}

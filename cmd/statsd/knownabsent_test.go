package main

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestMicroVMSampleKnownAbsent: a real micro-VM read (statsd's wiring, the
// guest-agent fake of a v2 guest with one container, as
// BenchmarkStatsWorkloadAgent reads it) asked with known_absent sends
// every KnownAbsent value as its code and only the throttled time as an
// AbsentValue; expanded, it is the answer of a request without the flag
// (the same values and reasons). A reason whose wording drifted from the
// table would leave a code out and fail here.
func TestMicroVMSampleKnownAbsent(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{
		UsageBytes: 200 << 20, MaxUsageBytes: 300 << 20, InactiveFileBytes: 10 << 20, CPUTotal: 1_000_000_000,
	})))
	client, _ := serveForBenchWithHealth(t, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}})
	read := func(known bool) *sandboxstatsv1.WorkloadStatsSample {
		resp, err := client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "bench", KnownAbsent: known})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSample()
	}
	coded := read(true)
	var codes []sandboxstatsv1.KnownAbsent
	for n := range sandboxstatsv1.KnownAbsent_name {
		if n != 0 {
			codes = append(codes, sandboxstatsv1.KnownAbsent(n))
		}
	}
	sortCodes := cmp.Transformer("sort", func(in []sandboxstatsv1.KnownAbsent) map[sandboxstatsv1.KnownAbsent]bool {
		m := map[sandboxstatsv1.KnownAbsent]bool{}
		for _, c := range in {
			m[c] = true
		}
		return m
	})
	if diff := cmp.Diff(codes, coded.GetKnownAbsent(), sortCodes); diff != "" {
		t.Errorf("known_absent codes (-every KnownAbsent value +sent):\n%s", diff)
	}
	var fields []string
	for _, a := range coded.GetAbsent() {
		fields = append(fields, a.GetField())
	}
	if diff := cmp.Diff([]string{"cpu_throttling.throttled_usec"}, fields); diff != "" {
		t.Errorf("absent values beside the codes (-want +got):\n%s", diff)
	}
	api.ExpandKnownAbsent(coded)
	set := func(s *sandboxstatsv1.WorkloadStatsSample) map[string]string {
		m := map[string]string{}
		for _, a := range s.GetAbsent() {
			m[a.GetField()] = a.GetReason()
		}
		return m
	}
	if diff := cmp.Diff(set(read(false)), set(coded)); diff != "" {
		t.Errorf("expanded absent values against a request without known_absent (-plain +expanded):\n%s", diff)
	}
}

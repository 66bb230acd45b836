package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func TestStatsHostIdentityChecked(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	_, err := h.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-a"})
	wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
	h.run(t, identA, gvRef)
	_, err = h.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-b"})
	wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
	// The host view answers even when the sandbox source cannot be read.
	h.src.set(source.Reading{}, fmt.Errorf("agent not answering: %w", source.ErrNotMeasurable))
	resp, err := h.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetIdentity().GetActorUid() != "actor-a" || resp.GetHost() == nil {
		t.Fatalf("resp = %v", resp)
	}
}

// TestHostViewOnTheWire: the domain host view a HostSampler returns reaches
// StatsHost and include_host in wire form.
func TestHostViewOnTheWire(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	run, idx := uint64(3_290_841_689), int32(0)
	h.host = &fakeHost{view: &source.HostStats{
		ObservedAtUnixNano: 42, GuestName: "srv1", GuestNameSource: "pid-file-dir",
		VMMThreads: &source.VMMThreadsView{PIDs: []int32{4242}, Threads: []source.VMMThread{
			{PID: 4242, TID: 4252, Name: "CPU 0/KVM", Class: source.VMMThreadClassVCPU, VCPUIndex: &idx, RunNs: &run},
		}},
		KVM: &source.KVMView{QMP: &source.KVMSourceView{Source: source.KVMSourceQMP, State: source.KVMSourceStateAvailable,
			Counters: []source.KVMCounter{{Name: "exits", Kind: source.KVMCounterKindCumulative, Scope: "vcpu0", Value: 7592, Unit: "count"}}}},
	}}
	h.run(t, identA, gvRef)
	want := &sandboxstatsv1.HostStats{
		ObservedAtUnixNano: 42, GuestName: "srv1", GuestNameSource: "pid-file-dir",
		VmmThreads: &sandboxstatsv1.VmmThreadsView{Pids: []int32{4242}, Threads: []*sandboxstatsv1.VmmThread{
			{Pid: 4242, Tid: 4252, Name: "CPU 0/KVM", Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU, VcpuIndex: &idx, RunNs: &run},
		}},
		Kvm: &sandboxstatsv1.KvmView{Qmp: &sandboxstatsv1.KvmSourceView{
			Source: sandboxstatsv1.KvmSource_KVM_SOURCE_QMP, State: sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE,
			Counters: []*sandboxstatsv1.KvmCounter{{Name: "exits", Kind: sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE, Scope: "vcpu0", Value: 7592, Unit: "count"}},
		}},
	}
	hostResp, err := h.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, hostResp.GetHost(), protocmp.Transform()); d != "" {
		t.Errorf("StatsHost host (-want +got)\n%s", d)
	}
	statsResp, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a", IncludeHost: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, statsResp.GetSample().GetHost(), protocmp.Transform()); d != "" {
		t.Errorf("include_host (-want +got)\n%s", d)
	}
}

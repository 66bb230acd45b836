package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestContainersOnTheWire: a reading's containers and a gVisor sandbox's
// own CPU reach the sample field by field, absent figures stay absent (not
// 0), the ended record's final carries them too, and a reading without
// containers gives a sample without them.
func TestContainersOnTheWire(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	r := cgroupRdg
	r.SandboxOwnCPUUsec = cpuUsec(250_000)
	r.Containers = []source.Container{
		{ID: "c1", Name: "app", CPUUsageUsec: cpuUsec(700_000), CPUUserUsec: cpuUsec(600_000), CPUSystemUsec: cpuUsec(100_000),
			MemoryCurrentBytes: cpuUsec(100 << 20), MemoryWorkingSetBytes: cpuUsec(90 << 20), MemoryIsOwn: true, PidsCurrent: cpuUsec(5)},
		{ID: "c2", CPUUsageUsec: cpuUsec(50_000),
			Absent: []source.Absent{{Field: "memory_current_bytes", Reason: "runsc reports the sandbox's total for this container"}}},
	}
	h.src.set(r, nil)
	h.run(t, identA, gvRef)
	want := []*sandboxstatsv1.ContainerStats{
		{Id: "c1", Name: "app", CpuUsageUsec: proto.Uint64(700_000), CpuUserUsec: proto.Uint64(600_000), CpuSystemUsec: proto.Uint64(100_000),
			MemoryCurrentBytes: proto.Uint64(100 << 20), MemoryWorkingSetBytes: proto.Uint64(90 << 20), MemoryIsOwn: true, PidsCurrent: proto.Uint64(5)},
		{Id: "c2", CpuUsageUsec: proto.Uint64(50_000),
			Absent: []*sandboxstatsv1.AbsentValue{{Field: "memory_current_bytes", Reason: "runsc reports the sandbox's total for this container"}}},
	}
	resp, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, resp.GetSample().GetContainers(), protocmp.Transform()); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if got := resp.GetSample().SandboxOwnCpuUsec; got == nil || *got != 250_000 {
		t.Errorf("sandbox_own_cpu_usec = %v, want 250000", got)
	}
	end, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, end.GetEnded().GetFinal().GetContainers(), protocmp.Transform()); diff != "" {
		t.Errorf("the ended record's final containers (-want +got):\n%s", diff)
	}

	t.Run("a reading without containers", func(t *testing.T) {
		h.src.set(cgroupRdg, nil)
		h.run(t, identA, gvRef)
		resp, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		if s := resp.GetSample(); s.GetContainers() != nil || s.SandboxOwnCpuUsec != nil {
			t.Errorf("containers %v, sandbox_own_cpu_usec %v: want neither", s.GetContainers(), s.SandboxOwnCpuUsec)
		}
	})
}

// TestWorkerPoolCarried: the identity's worker pool is accepted by Run
// with the other names' bounds, echoed in every sample, and kept in the
// ended record (its identity and its final).
func TestWorkerPoolCarried(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	id := proto.Clone(identA).(*sandboxstatsv1.WorkloadIdentity)
	id.WorkerPool = "pool-eu-1"

	t.Run("over 253 bytes is refused", func(t *testing.T) {
		bad := proto.Clone(id).(*sandboxstatsv1.WorkloadIdentity)
		bad.WorkerPool = strings.Repeat("p", 254)
		_, err := h.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: bad, Sandbox: gvRef})
		wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST)
	})

	h.run(t, id, gvRef)
	resp, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetSample().GetWorkerPool(); got != "pool-eu-1" {
		t.Errorf("sample worker_pool = %q", got)
	}
	active, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := active.GetSamples()[0].GetWorkerPool(); got != "pool-eu-1" {
		t.Errorf("active sample worker_pool = %q", got)
	}
	end, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, fin := end.GetEnded().GetIdentity().GetWorkerPool(), end.GetEnded().GetFinal().GetWorkerPool(); got != "pool-eu-1" || fin != "pool-eu-1" {
		t.Errorf("ended record worker_pool = %q, its final's %q", got, fin)
	}
}

// TestContainersCut: a sample whose containers put it over its cap first
// has its text cut (the containers' absent reasons among it), then loses
// the per-container list, named; the sums stay.
func TestContainersCut(t *testing.T) {
	s := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "actor-a", CpuUsageUsec: proto.Uint64(1), MemoryCurrentBytes: 1}
	for i := range 25 {
		c := &sandboxstatsv1.ContainerStats{Id: fmt.Sprintf("%03d%s", i, strings.Repeat("i", 253)), Name: strings.Repeat("n", 253),
			CpuUsageUsec: proto.Uint64(1)}
		for _, f := range []string{"cpu_user_usec", "cpu_system_usec", "memory_current_bytes", "memory_working_set_bytes", "pids_current"} {
			c.Absent = append(c.Absent, &sandboxstatsv1.AbsentValue{Field: f, Reason: strings.Repeat("r", 1024)})
		}
		s.Containers = append(s.Containers, c)
	}
	capSample(s)
	if size := proto.Size(s); size > maxSampleBytes {
		t.Fatalf("sample %d bytes, over %d", size, maxSampleBytes)
	}
	var cuts []string
	for _, a := range s.GetAbsent() {
		cuts = append(cuts, a.GetField())
	}
	if diff := cmp.Diff([]string{"text", "containers"}, cuts); diff != "" {
		t.Errorf("cuts (-want +got):\n%s", diff)
	}
	if s.GetContainers() != nil || s.GetCpuUsageUsec() != 1 {
		t.Errorf("containers %d left, cpu %d: want none, the sum kept", len(s.GetContainers()), s.GetCpuUsageUsec())
	}
}

package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// vmRef is a micro-VM: its guest agent's counters survive a restore.
var vmRef = &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
	AgentAddress: "vsock://3:1024", ContainerIds: []string{"web"}}

func checkpointA(t *testing.T, h *harness) *sandboxstatsv1.EndedActivation {
	t.Helper()
	resp, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatalf("CheckpointWorkload: %v", err)
	}
	return resp.GetEnded()
}

func pollA(t *testing.T, h *harness) *sandboxstatsv1.WorkloadStatsSample {
	t.Helper()
	resp, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatalf("StatsWorkload: %v", err)
	}
	return resp.GetSample()
}

// TestWireGuestBaseline: a restored micro-VM's epoch starts at the guest
// agent's first read after the Restore (its counters carry the guest's
// earlier lives): every sample carries epoch_baseline FIRST_READ with that
// read's counters, and the ended record's CPU is the final minus it, with
// baseline_delay_nanos saying how late after the epoch start it was taken.
func TestWireGuestBaseline(t *testing.T) {
	h := newHarness(t)
	guest := source.Reading{Kind: source.KindGuestAgent, Detail: "kata agent 3.2.0 at vsock://3:1024",
		MemoryCurrentBytes: 64 << 20, MemoryWorkingSetBytes: 60 << 20, CPUUsageUsec: cpuUsec(42_000_000)}
	h.src.set(guest, nil)
	resp, err := h.lifecycle.RestoreWorkload(context.Background(), &sandboxstatsv1.RestoreWorkloadRequest{Identity: identA, Sandbox: vmRef})
	if err != nil {
		t.Fatal(err)
	}
	epoch := resp.GetEpochUnixNano()
	// The store's baseline taker reads right after the Restore (the
	// harness clock moves a second a call, so later than the epoch).
	for deadline := time.Now().Add(5 * time.Second); h.store.Bound("actor-a").Activation.Baseline() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no baseline 5 s after the Restore")
		}
	}

	s := pollA(t, h)
	b := s.GetEpochBaseline()
	if b.GetKind() != sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ || b.GetObservedAtUnixNano() <= epoch ||
		b.GetFirstRead().GetCpuUsageUsec() != 42_000_000 || b.GetFirstRead().GetActorUid() != "actor-a" ||
		b.GetFirstRead().GetEpochUnixNano() != epoch || b.GetFirstRead().GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT {
		t.Fatalf("sample's epoch baseline = %v (epoch %d)", b, epoch)
	}
	active, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || len(active.GetSamples()) != 1 {
		t.Fatalf("StatsActiveWorkloads = %v, %v", active, err)
	}
	if diff := cmp.Diff(b, active.GetSamples()[0].GetEpochBaseline(), protocmp.Transform()); diff != "" {
		t.Errorf("discovery's baseline (-StatsWorkload +StatsActiveWorkloads):\n%s", diff)
	}

	guest.CPUUsageUsec = cpuUsec(42_700_000)
	h.src.set(guest, nil)
	e := checkpointA(t, h)
	if e.GetCpuUsec() != 700_000 || e.GetBaselineDelayNanos() <= 0 || e.GetBaselineDelayNanos() != b.GetObservedAtUnixNano()-epoch ||
		e.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT ||
		e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END {
		t.Fatalf("ended = %v; want 0.7 s of CPU and a baseline delay of %d ns", e, b.GetObservedAtUnixNano()-epoch)
	}
	if diff := cmp.Diff(b, e.GetFinal().GetEpochBaseline(), protocmp.Transform()); diff != "" {
		t.Errorf("final's baseline (-sample's +final's):\n%s", diff)
	}
}

// TestWireFinalProvenanceNone: an activation no read of which ever
// succeeded ends with FINAL_PROVENANCE_NONE: no final, the read's error as
// the reason, CPU and peak absent with their reasons (never 0).
func TestWireFinalProvenanceNone(t *testing.T) {
	h := newHarness(t)
	h.src.set(source.Reading{}, fmt.Errorf("%w: cgroup /statstest: no such directory", source.ErrNotMeasurable))
	epoch := h.run(t, identA, gvRef)
	active, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || active.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET {
		t.Fatalf("StatsActiveWorkloads = %v, %v", active, err)
	}
	e := checkpointA(t, h)
	if e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_NONE || e.GetFinal() != nil ||
		!strings.Contains(e.GetFinalReason(), "no such directory") || e.GetFinalAgeNanos() != 0 ||
		e.CpuUsec != nil || e.MemoryPeakBytes != nil || e.GetMemoryPeakIsLowerBound() ||
		e.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED || e.GetEpochUnixNano() != epoch ||
		e.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED {
		t.Fatalf("ended = %v", e)
	}
	absent := map[string]string{}
	for _, a := range e.GetAbsent() {
		absent[a.GetField()] = a.GetReason()
	}
	if absent["cpu_usec"] == "" || absent["memory_peak_bytes"] == "" {
		t.Errorf("absent = %v, want cpu_usec and memory_peak_bytes with their reasons", absent)
	}
	after, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil || len(after.GetEnded()) != 1 {
		t.Fatalf("StatsActiveWorkloads after = %v, %v", after, err)
	}
	if diff := cmp.Diff(e, after.GetEnded()[0], protocmp.Transform()); diff != "" {
		t.Errorf("served record (-checkpoint +served):\n%s", diff)
	}
}

// TestWireMemoryPeakLowerBound: a source without a peak (cgroup v1 before
// Linux 5.19) leaves every sample's peak absent, and the ended record's peak
// is the highest current any read saw, marked memory_peak_is_lower_bound; a
// source with a peak gives its own, not marked.
func TestWireMemoryPeakLowerBound(t *testing.T) {
	h := newHarness(t)
	noPeak := cgroupRdg
	noPeak.MemoryPeakBytes = nil
	noPeak.Absent = []source.Absent{{Field: "memory_peak_bytes", Reason: "no memory.peak before Linux 5.19"}}
	h.run(t, identA, gvRef)
	for _, cur := range []uint64{100 << 20, 300 << 20} {
		noPeak.MemoryCurrentBytes = cur
		h.src.set(noPeak, nil)
		if s := pollA(t, h); s.MemoryPeakBytes != nil {
			t.Fatalf("sample of a source without a peak has memory_peak_bytes %d", s.GetMemoryPeakBytes())
		}
	}
	noPeak.MemoryCurrentBytes = 150 << 20
	h.src.set(noPeak, nil)
	e := checkpointA(t, h)
	if e.MemoryPeakBytes == nil || e.GetMemoryPeakBytes() != 300<<20 || !e.GetMemoryPeakIsLowerBound() {
		t.Fatalf("ended peak %v (lower bound %v), want 300 MiB, the highest current seen, as a lower bound", e.MemoryPeakBytes, e.GetMemoryPeakIsLowerBound())
	}

	h.src.set(cgroupRdg, nil)
	h.run(t, identA, gvRef)
	pollA(t, h)
	if e := checkpointA(t, h); e.GetMemoryPeakBytes() != peak || e.GetMemoryPeakIsLowerBound() {
		t.Fatalf("ended peak %d (lower bound %v), want the source's %d, not a lower bound", e.GetMemoryPeakBytes(), e.GetMemoryPeakIsLowerBound(), peak)
	}
}

// TestWireReplaced: RunWorkload and RestoreWorkload answer, in replaced,
// the record of the same actor's activation they ended (outcome REPLACED,
// its own epoch, identity and final); nothing when nothing was bound or the
// call was a retry.
func TestWireReplaced(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	run := func(id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) *sandboxstatsv1.RunWorkloadResponse {
		t.Helper()
		resp, err := h.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: ref})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := run(identA, gvRef)
	if first.GetReplaced() != nil {
		t.Fatalf("first Run replaced %v", first.GetReplaced())
	}
	if retry := run(identA, gvRef); retry.GetReplaced() != nil || retry.GetEpochUnixNano() != first.GetEpochUnixNano() {
		t.Fatalf("retried Run = %v", retry)
	}
	pollA(t, h)
	r := cgroupRdg
	r.CPUUsageUsec = cpuUsec(2_500_000)
	h.src.set(r, nil)

	renamed := proto.Clone(identA).(*sandboxstatsv1.WorkloadIdentity)
	renamed.ActorName = "a-restored"
	restored, err := h.lifecycle.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: renamed, Sandbox: gvRef})
	if err != nil {
		t.Fatal(err)
	}
	rep := restored.GetReplaced()
	if rep.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED || rep.GetEpochUnixNano() != first.GetEpochUnixNano() ||
		rep.GetEndUnixNano() <= rep.GetEpochUnixNano() || rep.GetCpuUsec() != 2_500_000 ||
		rep.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END || rep.GetFinal().GetCpuUsageUsec() != 2_500_000 {
		t.Fatalf("Restore replaced %v (new epoch %d)", rep, restored.GetEpochUnixNano())
	}
	if diff := cmp.Diff(identA, rep.GetIdentity(), protocmp.Transform()); diff != "" {
		t.Errorf("replaced identity: the old activation's (-want +got):\n%s", diff)
	}

	other := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/statstest-2"}
	again := run(renamed, other)
	if rep2 := again.GetReplaced(); rep2.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED ||
		rep2.GetEpochUnixNano() != restored.GetEpochUnixNano() || rep2.GetIdentity().GetActorName() != "a-restored" {
		t.Fatalf("Run replaced %v, want the restored activation (epoch %d)", rep2, restored.GetEpochUnixNano())
	}
	list, err := h.client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
	if err != nil || len(list.GetEnded()) != 2 {
		t.Fatalf("ListEndedActivations = %v, %v; want the two replaced activations", list, err)
	}
	if diff := cmp.Diff(rep, list.GetEnded()[0], protocmp.Transform()); diff != "" {
		t.Errorf("listed record (-Restore's replaced +listed):\n%s", diff)
	}
}

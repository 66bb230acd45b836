package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	epoch := h.run(t, identA, gvRef)

	t.Run("retry keeps the epoch and opens nothing new", func(t *testing.T) {
		if again := h.run(t, identA, gvRef); again != epoch {
			t.Fatalf("retry epoch %d, want %d", again, epoch)
		}
		if n := h.opens.Load(); n != 1 {
			t.Fatalf("sources opened %d times, want 1", n)
		}
	})
	t.Run("another workload is refused", func(t *testing.T) {
		_, err := h.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: identB, Sandbox: gvRef})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_WORKLOAD_BOUND)
	})
	t.Run("a run that fails validation changes nothing", func(t *testing.T) {
		before := h.store.Bound("actor-a")
		for _, req := range []*sandboxstatsv1.RunWorkloadRequest{
			{Identity: identA, Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/../etc"}},
			{Identity: identA, Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: "tcp://1.2.3.4:1", ContainerIds: []string{"c"}}},
			{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: ""}, Sandbox: gvRef},
			{Identity: identA},
		} {
			_, err := h.lifecycle.RunWorkload(ctx, req)
			wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST)
		}
		if h.store.Bound("actor-a") != before {
			t.Fatal("a refused Run changed the binding")
		}
	})
	t.Run("restore starts a new epoch", func(t *testing.T) {
		resp, err := h.lifecycle.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: identA, Sandbox: gvRef})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetEpochUnixNano() <= epoch {
			t.Fatalf("restore epoch %d not after %d", resp.GetEpochUnixNano(), epoch)
		}
		s, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil || s.GetSample().GetEpochUnixNano() != resp.GetEpochUnixNano() {
			t.Fatalf("sample epoch = %d, %v; want %d", s.GetSample().GetEpochUnixNano(), err, resp.GetEpochUnixNano())
		}
	})
	t.Run("checkpoint of another actor is refused", func(t *testing.T) {
		_, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-b"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
	})
	t.Run("checkpoint forgets, closes the source, and a retry succeeds", func(t *testing.T) {
		closedBefore := h.src.closed.Load()
		for range 2 {
			if _, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"}); err != nil {
				t.Fatal(err)
			}
		}
		if h.src.closed.Load() == closedBefore {
			t.Error("checkpoint did not close the source")
		}
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
		// Now another workload may be bound.
		h.run(t, identB, gvRef)
	})
}

// TestReadNotBlockedByLifecycle holds the lifecycle lock, as a long restore
// does; reads must still answer at once.
func TestReadNotBlockedByLifecycle(t *testing.T) {
	h := newHarness(t)
	h.run(t, identA, gvRef)
	release := h.store.HoldLifecycle("actor-a")
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatalf("StatsWorkload while the lifecycle lock is held: %v", err)
	}
	if _, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{}); err != nil {
		t.Fatalf("StatsActiveWorkloads while the lifecycle lock is held: %v", err)
	}
	if _, err := h.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatalf("StatsHost while the lifecycle lock is held: %v", err)
	}
}

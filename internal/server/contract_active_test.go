package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestStatsActiveWorkloadsStates covers each state of the discovery read.
func TestStatsActiveWorkloadsStates(t *testing.T) {
	ctx := context.Background()
	t.Run("no workload", func(t *testing.T) {
		h := newHarness(t)
		resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 0 || resp.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD {
			t.Fatalf("resp = %v, want empty with NO_WORKLOAD", resp)
		}
	})
	t.Run("not measurable yet", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.src.set(source.Reading{}, fmt.Errorf("cgroup not created yet: %w", source.ErrNotMeasurable))
		resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 0 || resp.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET {
			t.Fatalf("resp = %v, want empty with NOT_MEASURABLE_YET", resp)
		}
	})
	// A lifecycle call that lands during the read: the answer is the state
	// it left (the read's sample dropped), never the old sample beside the
	// new state.
	t.Run("binding changed under the read", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.stats.afterRead = func() {
			h.stats.afterRead = nil
			_, _ = h.store.Release(context.Background(), "actor-a")
			h.run(t, identA, gvRef)
		}
		resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 0 || resp.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET || len(resp.GetEnded()) != 1 {
			t.Fatalf("resp = %v, want empty with NOT_MEASURABLE_YET and the ended activation", resp)
		}
	})
	t.Run("checkpointed under the read", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.stats.afterRead = func() {
			h.stats.afterRead = nil
			_, _ = h.store.Release(context.Background(), "actor-a")
		}
		resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 0 || resp.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD || len(resp.GetEnded()) != 1 {
			t.Fatalf("resp = %v, want empty with NO_WORKLOAD and the ended activation", resp)
		}
	})
	t.Run("one sample", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 1 || resp.GetSamples()[0].GetActorUid() != "actor-a" || resp.GetNoSampleReason() != 0 {
			t.Fatalf("resp = %v, want one sample of actor-a", resp)
		}
	})
	// A read failure is the workload's state, not the answer's: it is
	// pending with its reason, beside whatever else is bound.
	for _, tc := range []struct {
		err    error
		reason sandboxstatsv1.ErrorReason
	}{
		{fmt.Errorf("%w: memory.current", source.ErrTimeout), sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT},
		{fmt.Errorf("%w: memory.current: token \"x\"", source.ErrMalformed), sandboxstatsv1.ErrorReason_ERROR_REASON_MALFORMED_SOURCE},
		{fmt.Errorf("%w: no cgroup yet", source.ErrNotMeasurable), sandboxstatsv1.ErrorReason_ERROR_REASON_NOT_MEASURABLE},
	} {
		t.Run("a read failure is pending: "+tc.reason.String(), func(t *testing.T) {
			h := newHarness(t)
			epoch := h.run(t, identA, gvRef)
			h.src.set(source.Reading{}, tc.err)
			resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			want := &sandboxstatsv1.StatsActiveWorkloadsResponse{
				NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET, NoSampleDetail: tc.err.Error(),
				Pending: []*sandboxstatsv1.PendingWorkload{{Identity: identA, SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
					EpochUnixNano: epoch, Reason: tc.reason, Detail: tc.err.Error()}},
				EndedLog: &sandboxstatsv1.EndedLog{InstanceId: h.store.EndedLog().InstanceID, LowestSequence: 1, NextSequence: 1},
			}
			if diff := cmp.Diff(want, resp, protocmp.Transform()); diff != "" {
				t.Fatalf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// blockingSource answers like its fakeSource until block is set, then hangs
// until the caller's deadline (a hung read at checkpoint).
type blockingSource struct {
	fakeSource
	block chan struct{}
}

func (b *blockingSource) Sample(ctx context.Context) (source.Reading, error) {
	select {
	case <-b.block:
		<-ctx.Done()
		return source.Reading{}, fmt.Errorf("%w: memory.current: %w", source.ErrTimeout, ctx.Err())
	default:
		return b.fakeSource.Sample(ctx)
	}
}

func TestCheckpointCarriesTheFinalSample(t *testing.T) {
	h := newHarness(t)
	epoch := h.run(t, identA, gvRef)
	final := cgroupRdg
	final.CPUUsageUsec = cpuUsec(2_500_000)
	h.src.set(final, nil)
	resp, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	e := resp.GetEnded()
	if e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END ||
		e.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED ||
		e.GetEpochUnixNano() != epoch || e.GetCpuUsec() != 2_500_000 || e.GetMemoryPeakBytes() != peak ||
		e.GetFinal().GetCpuUsageUsec() != 2_500_000 || e.GetFinal().GetActorUid() != "actor-a" ||
		e.GetFinal().GetEpochBaseline().GetKind() != sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START ||
		e.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP {
		t.Fatalf("ended = %v", e)
	}
	if diff := cmp.Diff(identA, e.GetIdentity(), protocmp.Transform()); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}

	t.Run("a retry returns the same record", func(t *testing.T) {
		again, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(e, again.GetEnded(), protocmp.Transform()); diff != "" {
			t.Errorf("retry (-first +retry):\n%s", diff)
		}
	})
	t.Run("pollers get the record with no workload bound", func(t *testing.T) {
		reads := h.src.calls.Load()
		active, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if active.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD || len(active.GetEnded()) != 1 {
			t.Fatalf("active = %v", active)
		}
		if diff := cmp.Diff(e, active.GetEnded()[0], protocmp.Transform()); diff != "" {
			t.Errorf("ended in active (-checkpoint +active):\n%s", diff)
		}
		list, err := h.client.ListEndedActivations(context.Background(), &sandboxstatsv1.ListEndedActivationsRequest{})
		if err != nil || len(list.GetEnded()) != 1 {
			t.Fatalf("ListEndedActivations = %v, %v", list, err)
		}
		if h.src.calls.Load() != reads {
			t.Error("listing ended activations read the source")
		}
	})
}

// TestCheckpointFinalReadHangs: a hung final read costs the Checkpoint the
// read timeout (the harness store's default, 2 s) plus a little, the
// workload is forgotten, and the final is the last good poll with its age.
func TestCheckpointFinalReadHangs(t *testing.T) {
	h := newHarness(t)
	bs := &blockingSource{fakeSource: fakeSource{reading: cgroupRdg}, block: make(chan struct{})}
	h.src = &bs.fakeSource
	h.open = func() source.Source { return bs }
	h.run(t, identA, gvRef)
	if _, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatal(err)
	}
	close(bs.block)
	start := time.Now()
	resp, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if took > 3*time.Second {
		t.Errorf("Checkpoint took %s with a 2 s read timeout", took)
	}
	e := resp.GetEnded()
	if e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL || e.GetFinalReason() == "" ||
		e.GetFinal().GetCpuUsageUsec() != *cgroupRdg.CPUUsageUsec {
		t.Fatalf("ended = %v", e)
	}
	if h.store.Bound("actor-a") != nil {
		t.Fatal("still bound")
	}
}

// TestPollDuringCheckpoint: a poll landing while a Checkpoint's final read
// runs answers the bound workload (the old state) or no workload (the new
// one), never a mix, and is not held up by the Checkpoint.
func TestPollDuringCheckpoint(t *testing.T) {
	h := newHarness(t)
	bs := &blockingSource{fakeSource: fakeSource{reading: cgroupRdg}, block: make(chan struct{})}
	h.open = func() source.Source { return bs }
	h.run(t, identA, gvRef)
	close(bs.block) // every read now hangs until its deadline
	done := make(chan error, 1)
	go func() {
		_, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if time.Since(start) > time.Second {
		t.Errorf("poll held %s by the checkpoint", time.Since(start))
	}
	switch {
	case err != nil:
		t.Fatalf("poll failed with %v", err)
	case len(resp.GetPending()) == 1: // the old state: the bound workload's read ran out of the poll's time
		if p := resp.GetPending()[0]; p.GetReason() != sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT || p.GetIdentity().GetActorUid() != "actor-a" || len(resp.GetEnded()) != 0 {
			t.Errorf("old state = %v, want actor-a pending READ_TIMEOUT and no record", resp)
		}
	case resp.GetNoSampleReason() == sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD:
		if len(resp.GetEnded()) != 1 {
			t.Errorf("new state without its record: %v", resp)
		}
	default:
		t.Fatalf("poll answered %v", resp)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPollsDuringLifecycleChurn: pollers racing back-to-back Run and
// Checkpoint calls (with state on disk, so each end spends an fsync between
// writing its record and forgetting the workload) always get one state:
// never a sample of an activation together with its own ended record (the
// old and the new state mixed), and every activation's record is in some
// answer after it ended.
func TestPollsDuringLifecycleChurn(t *testing.T) {
	h := newHarness(t, func(c *identity.Config) {
		c.StateDir = t.TempDir()
		c.EndedRetention = 1 << 62 // the harness clock moves a second a call
	})
	const rounds = 40
	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		polls    atomic.Int64
		mixed    atomic.Int64
		mixedMsg atomic.Value
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
				if err != nil {
					t.Errorf("poll: %v", err)
					return
				}
				polls.Add(1)
				for _, s := range resp.GetSamples() {
					for _, e := range resp.GetEnded() {
						if e.GetIdentity().GetActorUid() == s.GetActorUid() && e.GetEpochUnixNano() == s.GetEpochUnixNano() {
							mixed.Add(1)
							mixedMsg.Store(fmt.Sprintf("sample of epoch %d beside its own ended record", s.GetEpochUnixNano()))
						}
					}
				}
			}
		}()
	}
	epochs := map[int64]bool{}
	for range rounds {
		epochs[h.run(t, identA, gvRef)] = true
		if _, err := h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d polls over %d activations", polls.Load(), rounds)
	if n := mixed.Load(); n > 0 {
		t.Errorf("%d answers mixed the old and the new state, e.g. %v", n, mixedMsg.Load())
	}
	final, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range final.GetEnded() {
		delete(epochs, e.GetEpochUnixNano())
	}
	if len(epochs) != 0 {
		t.Errorf("%d activations have no ended record: %v", len(epochs), epochs)
	}
}

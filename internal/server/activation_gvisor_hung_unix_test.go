//go:build unix

package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestGVisorFinalReadHangs: a real gVisor source on a v2 fixture tree,
// polled once, then memory.current replaced by a FIFO with no writer
// (opening it never returns): the Checkpoint costs at most the read timeout
// plus a little, the workload is forgotten, and the final is that poll's
// reading, marked last-good-poll with its age and the read's error.
func TestGVisorFinalReadHangs(t *testing.T) {
	const readTimeout = 500 * time.Millisecond
	f := newGVisorFixture(t, readTimeout)
	f.h.run(t, identA, f.ref)
	f.clk.advance(2 * time.Second)
	polled := f.clk.now()
	resp := f.poll(t)
	if len(resp.GetSamples()) != 1 || resp.GetSamples()[0].GetCpuUsageUsec() != 255_682 {
		t.Fatalf("poll before the FIFO: %v", resp)
	}

	fifo := filepath.Join(f.root, "sandbox", "memory.current")
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // unblock the hung open so nothing leaks
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	f.clk.advance(3 * time.Second)
	start := time.Now()
	cp, err := f.h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Checkpoint with memory.current a FIFO took %v (read timeout %v): %q", took.Round(time.Millisecond), readTimeout, cp.GetEnded().GetFinalReason())
	// A little: scheduling on a loaded 2-core runner, not another read.
	if took < readTimeout || took > readTimeout+time.Second {
		t.Errorf("Checkpoint took %v, want the %v read timeout plus at most 1 s", took, readTimeout)
	}
	e := cp.GetEnded()
	if e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL ||
		e.GetFinalAgeNanos() != int64(3*time.Second) || e.GetFinal().GetObservedAtUnixNano() != polled.UnixNano() ||
		e.GetFinal().GetCpuUsageUsec() != 255_682 || e.GetCpuUsec() != 255_682 ||
		e.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED {
		t.Fatalf("ended = %v; want last-good-poll 3 s before the end with the poll's 255682 us", e)
	}
	if r := e.GetFinalReason(); !strings.Contains(r, "memory.current") || !strings.Contains(r, "timed out") {
		t.Errorf("final reason %q, want the timed-out read of memory.current", r)
	}
	if f.h.store.Bound("actor-a") != nil {
		t.Fatal("the workload is still bound after the Checkpoint")
	}
	start = time.Now()
	after := f.poll(t)
	// No read at all now (nothing is bound): the bound is the runner's
	// scheduling, not a read timeout.
	if after.GetNoSampleReason() != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD || len(after.GetEnded()) != 1 || time.Since(start) > 2*time.Second {
		t.Errorf("poll after the Checkpoint (%v): %v", time.Since(start), after)
	}
}

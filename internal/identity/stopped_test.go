package identity

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// seenDeadCall is one question ReleaseWith asked of SeenDead.
type seenDeadCall struct {
	Actor string
	Epoch int64
	By    int64 // unix nanos
}

// TestOutcomesRuntimeStopped: with RuntimeStopped a dead final is the
// expected end (checkpointed) unless the OOM kill count rose (OOM-killed)
// or statsd had seen it dead before (sandbox-dead); a live one is
// checkpointed either way; the provenance is as without the flag.
func TestOutcomesRuntimeStopped(t *testing.T) {
	noProcess := source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(0), CPUUsageUsec: u64(9)}
	oom := noProcess
	oom.Memory = &source.MemorySignals{OOMKills: u64(1)}
	noKill := noProcess
	noKill.Memory = &source.MemorySignals{OOMKills: u64(0)}
	sentryExited := source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(1), CPUUsageUsec: u64(9), SentryExited: true}
	sentryOOM := sentryExited
	sentryOOM.Memory = &source.MemorySignals{OOMKills: u64(1)}
	gone := fmt.Errorf("%w: %w", source.ErrNotMeasurable, source.ErrSandboxGone)

	type want struct {
		Outcome    Outcome
		Provenance Provenance
		Asked      bool // whether SeenDead was asked
	}
	for _, tc := range []struct {
		name    string
		final   source.Reading
		err     error
		poll    *source.Reading // a poll's reading before the end
		stopped bool
		seen    bool // what SeenDead answers
		want    want
	}{
		{name: "running, stopped", final: reading(1, 1), stopped: true, want: want{OutcomeCheckpointed, ProvenanceReadAtEnd, true}},
		{name: "running, stopped, seen dead before", final: reading(1, 1), stopped: true, seen: true, want: want{OutcomeCheckpointed, ProvenanceReadAtEnd, true}},
		{name: "no process", final: noProcess, want: want{OutcomeSandboxDead, ProvenanceReadAtEnd, false}},
		{name: "no process, seen dead, not stopped", final: noProcess, seen: true, want: want{OutcomeSandboxDead, ProvenanceReadAtEnd, false}},
		{name: "no process, stopped", final: noProcess, stopped: true, want: want{OutcomeCheckpointed, ProvenanceReadAtEnd, true}},
		{name: "no process, stopped, seen dead before", final: noProcess, stopped: true, seen: true, want: want{OutcomeSandboxDead, ProvenanceReadAtEnd, true}},
		{name: "no process, no kill, stopped", final: noKill, stopped: true, want: want{OutcomeCheckpointed, ProvenanceReadAtEnd, true}},
		{name: "oom killed", final: oom, want: want{OutcomeOOMKilled, ProvenanceReadAtEnd, false}},
		{name: "oom killed, stopped", final: oom, stopped: true, want: want{OutcomeOOMKilled, ProvenanceReadAtEnd, true}},
		{name: "oom killed, stopped, seen dead before", final: oom, stopped: true, seen: true, want: want{OutcomeOOMKilled, ProvenanceReadAtEnd, true}},
		{name: "sentry exited", final: sentryExited, want: want{OutcomeSandboxDead, ProvenanceReadAtEnd, false}},
		{name: "sentry exited, stopped", final: sentryExited, stopped: true, want: want{OutcomeCheckpointed, ProvenanceReadAtEnd, true}},
		{name: "sentry oom-killed, stopped", final: sentryOOM, stopped: true, want: want{OutcomeOOMKilled, ProvenanceReadAtEnd, true}},
		{name: "sandbox gone", err: gone, poll: new(reading(5, 5)), want: want{OutcomeSandboxDead, ProvenanceLastGoodPoll, false}},
		{name: "sandbox gone, stopped", err: gone, poll: new(reading(5, 5)), stopped: true, want: want{OutcomeCheckpointed, ProvenanceLastGoodPoll, true}},
		{name: "sandbox gone, stopped, seen dead before", err: gone, poll: new(reading(5, 5)), stopped: true, seen: true, want: want{OutcomeSandboxDead, ProvenanceLastGoodPoll, true}},
		{name: "sandbox gone, oom in the last poll, stopped", err: gone, poll: &oom, stopped: true, want: want{OutcomeOOMKilled, ProvenanceLastGoodPoll, true}},
		{name: "sandbox gone, never read, stopped", err: gone, stopped: true, want: want{OutcomeCheckpointed, ProvenanceNone, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &scriptedSource{r: tc.final, err: tc.err}
			s := storeWith(t, "", src, fakeClock())
			b, _, err := s.Bind(context.Background(), OpRun, idA, refA)
			if err != nil {
				t.Fatal(err)
			}
			if tc.poll != nil {
				b.Activation.Observe(*tc.poll, b.EpochUnixNano+1)
			}
			var asked []seenDeadCall
			e, err := s.ReleaseWith(context.Background(), idA.ActorUID, ReleaseOptions{
				RuntimeStopped: tc.stopped,
				SeenDead: func(actor string, epoch int64, by time.Time) bool {
					asked = append(asked, seenDeadCall{actor, epoch, by.UnixNano()})
					return tc.seen
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			got := want{e.Outcome, e.Provenance, len(asked) > 0}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			// Asked once, of this activation, with the call's arrival: after
			// the epoch began, before the final read ended it.
			for _, a := range asked {
				if a.Actor != idA.ActorUID || a.Epoch != b.EpochUnixNano || a.By <= b.EpochUnixNano || a.By >= e.EndUnixNano {
					t.Errorf("SeenDead asked %+v; want actor %q, epoch %d, by within (%d, %d)", a, idA.ActorUID, b.EpochUnixNano, b.EpochUnixNano, e.EndUnixNano)
				}
			}
			if len(asked) > 1 {
				t.Errorf("SeenDead asked %d times, want once", len(asked))
			}
		})
	}
}

// TestRuntimeStoppedRetry: a retried Checkpoint returns the record as first
// made, whatever its RuntimeStopped says.
func TestRuntimeStoppedRetry(t *testing.T) {
	dead := source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(0), CPUUsageUsec: u64(9)}
	for _, tc := range []struct {
		name         string
		first, retry bool
		want         Outcome
	}{
		{name: "stopped, retried without", first: true, retry: false, want: OutcomeCheckpointed},
		{name: "not stopped, retried stopped", first: false, retry: true, want: OutcomeSandboxDead},
		{name: "stopped, retried stopped", first: true, retry: true, want: OutcomeCheckpointed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := storeWith(t, t.TempDir(), &scriptedSource{r: dead}, fakeClock())
			if _, _, err := s.Bind(context.Background(), OpRun, idA, refA); err != nil {
				t.Fatal(err)
			}
			e, err := s.ReleaseWith(context.Background(), idA.ActorUID, ReleaseOptions{RuntimeStopped: tc.first})
			if err != nil {
				t.Fatal(err)
			}
			again, err := s.ReleaseWith(context.Background(), idA.ActorUID, ReleaseOptions{RuntimeStopped: tc.retry,
				SeenDead: func(string, int64, time.Time) bool { t.Error("SeenDead asked on a retry"); return true }})
			if err != nil {
				t.Fatal(err)
			}
			if again != e {
				t.Errorf("retry returned %+v, want the first record %+v", again, e)
			}
			if diff := cmp.Diff(tc.want, again.Outcome); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

package identity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// scriptedSource answers Sample from a settable reading or error; block
// makes it wait for the caller's deadline (a hung read).
type scriptedSource struct {
	mu    sync.Mutex
	r     source.Reading
	err   error
	block bool
	calls int
}

func (s *scriptedSource) set(r source.Reading, err error, block bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.r, s.err, s.block = r, err, block
}

func (s *scriptedSource) Sample(ctx context.Context) (source.Reading, error) {
	s.mu.Lock()
	s.calls++
	r, err, block := s.r, s.err, s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return source.Reading{}, fmt.Errorf("%w: %w", source.ErrTimeout, ctx.Err())
	}
	return r, err
}

func (s *scriptedSource) Close() error { return nil }

func u64(v uint64) *uint64 { return &v }
func u32(v uint32) *uint32 { return &v }

// reading is a cgroup reading with the CPU counter and current memory given.
func reading(cpu, current uint64) source.Reading {
	return source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(cpu), MemoryCurrentBytes: current, SandboxProcesses: u32(3)}
}

func storeWith(t *testing.T, dir string, src source.Source, clock func() time.Time) *Store {
	t.Helper()
	s, err := NewStore(Config{StateDir: dir, Now: clock, ReadTimeout: 200 * time.Millisecond, BaselineRetry: 10 * time.Millisecond,
		Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) { return src, nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestReleaseTakesTheFinalReading(t *testing.T) {
	src := &scriptedSource{r: reading(5_000, 100<<20)}
	s := storeWith(t, t.TempDir(), src, fakeClock())
	b, _, err := s.Bind(context.Background(), OpRun, idA, refA)
	if err != nil {
		t.Fatal(err)
	}
	b.Activation.Observe(reading(2_000, 300<<20), b.EpochUnixNano+1)
	src.set(source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(7_000), MemoryPeakBytes: u64(400 << 20), MemoryCurrentBytes: 50 << 20, SandboxProcesses: u32(2)}, nil, false)
	e, err := s.Release(context.Background(), idA.ActorUID)
	if err != nil {
		t.Fatal(err)
	}
	if s.Bound("actor-a") != nil {
		t.Fatal("still bound")
	}
	want := &Ended{
		Identity: idA, Class: source.ClassGVisor, EpochUnixNano: b.EpochUnixNano, EndUnixNano: e.EndUnixNano,
		Outcome: OutcomeCheckpointed, Provenance: ProvenanceReadAtEnd,
		Final:           &source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(7_000), MemoryPeakBytes: u64(400 << 20), MemoryCurrentBytes: 50 << 20, SandboxProcesses: u32(2)},
		FinalAtUnixNano: e.FinalAtUnixNano,
		Baseline:        &Baseline{Kind: BaselineEpochStart, AtUnixNano: b.EpochUnixNano},
		CPUUsec:         u64(7_000), PeakBytes: u64(400 << 20),
		InstanceID: s.EndedLog().InstanceID, Sequence: 1,
	}
	if diff := cmp.Diff(want, e, cmpopts.IgnoreUnexported(Ended{})); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	t.Run("a retry returns the same record", func(t *testing.T) {
		again, err := s.Release(context.Background(), idA.ActorUID)
		if err != nil || again != e {
			t.Fatalf("retry = %v, %v; want the same record", again, err)
		}
	})
	t.Run("listed as ended", func(t *testing.T) {
		if got := s.Ended(); len(got) != 1 || got[0] != e {
			t.Fatalf("Ended() = %v", got)
		}
	})
}

func TestFinalFallsBackToTheLastGoodPoll(t *testing.T) {
	clock := fakeClock()
	src := &scriptedSource{}
	s := storeWith(t, t.TempDir(), src, clock)
	b, _, err := s.Bind(context.Background(), OpRun, idA, refA)
	if err != nil {
		t.Fatal(err)
	}
	polled := clock().UnixNano()
	b.Activation.Observe(source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(3_000), MemoryCurrentBytes: 80 << 20}, polled)
	b.Activation.Observe(source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(4_000), MemoryCurrentBytes: 60 << 20}, polled+1)

	t.Run("hung read costs the read timeout and the workload is forgotten", func(t *testing.T) {
		src.set(source.Reading{}, nil, true)
		start := time.Now()
		e, err := s.Release(context.Background(), idA.ActorUID)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 200*time.Millisecond+time.Second {
			t.Errorf("Release took %s with a 200 ms read timeout", took)
		}
		if s.Bound("actor-a") != nil {
			t.Fatal("still bound after a Release whose final read hung")
		}
		if e.Provenance != ProvenanceLastGoodPoll || !strings.Contains(e.FinalReason, "timed out") {
			t.Fatalf("provenance %v reason %q", e.Provenance, e.FinalReason)
		}
		if got := *e.Final.CPUUsageUsec; got != 4_000 {
			t.Errorf("final CPU %d, want the last good poll's 4000", got)
		}
		if e.FinalAgeNanos <= 0 {
			t.Errorf("final age %d, want > 0", e.FinalAgeNanos)
		}
		if e.PeakBytes == nil || *e.PeakBytes != 80<<20 || !e.PeakIsLowerBound {
			t.Errorf("peak %v lower bound %v, want the highest current seen (80 MiB) as a lower bound", e.PeakBytes, e.PeakIsLowerBound)
		}
	})
}

func TestFinalNoneWhenNothingWasRead(t *testing.T) {
	src := &scriptedSource{err: fmt.Errorf("%w: no cgroup yet", source.ErrNotMeasurable)}
	s := storeWith(t, t.TempDir(), src, fakeClock())
	if _, _, err := s.Bind(context.Background(), OpRun, idA, refA); err != nil {
		t.Fatal(err)
	}
	e, err := s.Release(context.Background(), idA.ActorUID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Provenance != ProvenanceNone || e.Final != nil || e.CPUUsec != nil || e.PeakBytes != nil || len(e.Absent) != 2 {
		t.Fatalf("record %+v, want provenance none, no final, CPU and peak absent", e)
	}
}

func TestOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		final source.Reading
		err   error
		want  Outcome
	}{
		{"running", reading(1, 1), nil, OutcomeCheckpointed},
		{"no process left", source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(0), CPUUsageUsec: u64(1)}, nil, OutcomeSandboxDead},
		{"oom killed", source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(0), CPUUsageUsec: u64(1),
			Memory: &source.MemorySignals{OOMKills: u64(1)}}, nil, OutcomeOOMKilled},
		{"no process, no kill", source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(0), CPUUsageUsec: u64(1),
			Memory: &source.MemorySignals{OOMKills: u64(0)}}, nil, OutcomeSandboxDead},
		{"sandbox gone", source.Reading{}, fmt.Errorf("%w: %w", source.ErrNotMeasurable, source.ErrSandboxGone), OutcomeSandboxDead},
		{"sentry exited, a process left in its cgroup", source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(1), CPUUsageUsec: u64(1),
			SentryExited: true}, nil, OutcomeSandboxDead},
		{"sentry OOM-killed, a process left in its cgroup", source.Reading{Kind: source.KindCgroup, SandboxProcesses: u32(1), CPUUsageUsec: u64(1),
			SentryExited: true, Memory: &source.MemorySignals{OOMKills: u64(1)}}, nil, OutcomeOOMKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &scriptedSource{r: tc.final, err: tc.err}
			s := storeWith(t, "", src, fakeClock())
			if _, _, err := s.Bind(context.Background(), OpRun, idA, refA); err != nil {
				t.Fatal(err)
			}
			e, err := s.Release(context.Background(), idA.ActorUID)
			if err != nil {
				t.Fatal(err)
			}
			if e.Outcome != tc.want {
				t.Errorf("outcome %v, want %v", e.Outcome, tc.want)
			}
		})
	}
}

// TestRebindEndsTheActivation: a Run or Restore of the bound actor with
// another ref ends its activation (outcome replaced) before the new epoch.
func TestRebindEndsTheActivation(t *testing.T) {
	src := &scriptedSource{r: reading(9_000, 1)}
	s := storeWith(t, t.TempDir(), src, fakeClock())
	b1, replaced, err := s.Bind(context.Background(), OpRun, idA, refA)
	if err != nil || replaced != nil {
		t.Fatalf("first Run: %v, replaced %v", err, replaced)
	}
	b2, replaced, err := s.Bind(context.Background(), OpRestore, idA, refA)
	if err != nil {
		t.Fatal(err)
	}
	if replaced == nil || replaced.Outcome != OutcomeReplaced || replaced.EpochUnixNano != b1.EpochUnixNano || *replaced.CPUUsec != 9_000 {
		t.Fatalf("replaced = %+v", replaced)
	}
	if b2.EpochUnixNano <= b1.EpochUnixNano {
		t.Fatal("no new epoch")
	}
	if b2.EpochUnixNano < replaced.EndUnixNano {
		t.Errorf("the new epoch begins at %d, before the replaced activation's end %d: the two overlap", b2.EpochUnixNano, replaced.EndUnixNano)
	}
	if _, again, _ := s.Bind(context.Background(), OpRestore, idA, refA); again != nil {
		t.Fatal("a retried Restore ended an activation")
	}
}

// TestGuestBaseline: a micro-VM's counters survive a restore, so the epoch's
// first successful read is its baseline; it is taken right after the Run
// without waiting for a poll, persisted, and the activation's CPU is the
// final minus it.
func TestGuestBaseline(t *testing.T) {
	dir := t.TempDir()
	src := &scriptedSource{err: fmt.Errorf("%w: agent not up", source.ErrNotMeasurable)}
	s := storeWith(t, dir, src, time.Now)
	b, _, err := s.Bind(context.Background(), OpRestore, idA, refB)
	if err != nil {
		t.Fatal(err)
	}
	if b.Activation.Baseline() != nil {
		t.Fatal("baseline before any read")
	}
	time.Sleep(50 * time.Millisecond) // a few failed tries
	src.set(source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: u64(50_000_000)}, nil, false)
	deadline := time.Now().Add(5 * time.Second)
	for b.Activation.Baseline() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	base := b.Activation.Baseline()
	if base == nil || base.Kind != BaselineFirstRead || *base.FirstRead.CPUUsageUsec != 50_000_000 {
		t.Fatalf("baseline = %+v", base)
	}
	// Persisted: a restarted store has it without reading.
	waitFor(t, func() bool {
		st, _ := os.ReadFile(filepath.Join(dir, stateFileName))
		return len(st) > 0 && strings.Contains(string(st), `"baseline"`)
	})
	s.Close()
	src2 := &scriptedSource{err: fmt.Errorf("%w: agent gone", source.ErrNotMeasurable)}
	s2 := storeWith(t, dir, src2, time.Now)
	if got := s2.Bound("actor-a").Activation.Baseline(); got == nil || *got.FirstRead.CPUUsageUsec != 50_000_000 {
		t.Fatalf("restarted baseline = %+v", got)
	}
	src2.set(source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: u64(50_750_000)}, nil, false)
	e, err := s2.Release(context.Background(), idA.ActorUID)
	if err != nil {
		t.Fatal(err)
	}
	if e.CPUUsec == nil || *e.CPUUsec != 750_000 {
		t.Fatalf("activation CPU %v, want final minus baseline 750000", e.CPUUsec)
	}
	if e.BaselineDelayNanos <= 0 {
		t.Errorf("baseline delay %d, want the time the agent took to answer", e.BaselineDelayNanos)
	}
}

// TestEndSurvivesRestart: a record is kept across a restart, and a binding
// whose end was recorded but not yet cleared (statsd stopped between the two
// writes) is cleared at start.
func TestEndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	src := &scriptedSource{r: reading(1_234, 1)}
	s := storeWith(t, dir, src, fakeClock())
	b, _, err := s.Bind(context.Background(), OpRun, idA, refA)
	if err != nil {
		t.Fatal(err)
	}
	bindingBefore, _ := os.ReadFile(filepath.Join(dir, stateFileName))
	e, err := s.Release(context.Background(), idA.ActorUID)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Put back the binding as it was before the Release: the end is
	// recorded, the clear was lost.
	if err := os.WriteFile(filepath.Join(dir, stateFileName), bindingBefore, 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := storeWith(t, dir, src, fakeClock())
	if s2.Bound("actor-a") != nil {
		t.Fatal("a binding whose end was recorded is bound again after a restart")
	}
	got := s2.Ended()
	if len(got) != 1 || got[0].EpochUnixNano != b.EpochUnixNano || *got[0].CPUUsec != *e.CPUUsec {
		t.Fatalf("ended after restart = %+v", got)
	}
	if again, err := s2.Release(context.Background(), idA.ActorUID); err != nil || again.EpochUnixNano != e.EpochUnixNano {
		t.Fatalf("retried checkpoint after restart = %+v, %v", again, err)
	}
}

func TestCorruptEndedFileIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, endedFileName)
	if err := os.WriteFile(p, []byte(`{"version":1,"ended":[{"identity":{"actor_uid":""}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := storeWith(t, dir, &scriptedSource{}, fakeClock())
	if len(s.Ended()) != 0 {
		t.Fatal("loaded a corrupt record")
	}
	if aside, _ := filepath.Glob(p + ".corrupt-*"); len(aside) != 1 {
		t.Fatalf("moved aside: %v", aside)
	}
}

func TestEndedBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	src := &scriptedSource{r: reading(1, 1)}
	s, err := NewStore(Config{Now: clock, EndedMax: 3, EndedRetention: time.Minute,
		Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) { return src, nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 5 {
		id := Identity{ActorUID: fmt.Sprint("actor-", i)}
		if _, _, err := s.Bind(context.Background(), OpRun, id, refA); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		if _, err := s.Release(context.Background(), id.ActorUID); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, e := range s.Ended() {
		got = append(got, e.Identity.ActorUID)
	}
	if diff := cmp.Diff([]string{"actor-2", "actor-3", "actor-4"}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	now = now.Add(2 * time.Minute)
	if n := len(s.Ended()); n != 0 {
		t.Errorf("%d records past the retention", n)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatal("condition not met within 5 s")
}

// TestPartialReadIsNoBaseline: a guest agent that fails one container on
// its first answers of an epoch (a partial reading: no CPU sum) cannot make
// that reading the baseline and so leave its activation's CPU uncharged;
// the first whole reading with the CPU counter is the baseline, whether the
// background taker or a poll reads it.
func TestPartialReadIsNoBaseline(t *testing.T) {
	partial := source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 1 << 20,
		UnreadContainers: []source.ContainerError{{ID: "b", Reason: "hostile"}}}
	noCPU := source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 1 << 20}
	for _, tc := range []struct {
		name  string
		first source.Reading
	}{{"one container failed", partial}, {"no CPU counter", noCPU}} {
		t.Run(tc.name, func(t *testing.T) {
			src := &scriptedSource{r: tc.first}
			s := storeWith(t, t.TempDir(), src, time.Now)
			b, _, err := s.Bind(context.Background(), OpRestore, idA, refB)
			if err != nil {
				t.Fatal(err)
			}
			b.Activation.Observe(tc.first, time.Now().UnixNano()) // a poll's reading too
			time.Sleep(50 * time.Millisecond)                     // the taker's first tries
			if base := b.Activation.Baseline(); base != nil {
				t.Fatalf("baseline from a reading that is not whole: %+v", base)
			}
			src.set(source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: u64(100_000_000)}, nil, false)
			waitFor(t, func() bool { return b.Activation.Baseline() != nil })
			if got, ok := b.Activation.Baseline().CPUUsec(); !ok || got != 100_000_000 {
				t.Fatalf("baseline CPU %d (%v), want the whole reading's 100000000", got, ok)
			}
			src.set(source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: u64(100_400_000)}, nil, false)
			e, err := s.Release(context.Background(), idA.ActorUID)
			if err != nil {
				t.Fatal(err)
			}
			if e.CPUUsec == nil || *e.CPUUsec != 400_000 {
				t.Fatalf("activation CPU %v (absent %v), want final minus the whole baseline: 400000", e.CPUUsec, e.Absent)
			}
		})
	}
}

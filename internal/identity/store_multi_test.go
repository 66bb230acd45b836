package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// actorRef is actor i's own sandbox: a cgroup leaf in the upstream layout.
func actorRef(i int) source.SandboxRef {
	return source.SandboxRef{Class: source.ClassGVisor, CgroupPath: fmt.Sprintf("/pod/actor-%d-_pause", i)}
}

func actorID(i int) Identity { return Identity{ActorUID: fmt.Sprintf("actor-%d", i)} }

// perRefSources opens one scriptedSource per cgroup path, so each binding
// reads its own.
type perRefSources struct {
	mu   sync.Mutex
	srcs map[string]*scriptedSource
}

func (p *perRefSources) open(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
	return p.of(ref.CgroupPath), nil, nil
}

func (p *perRefSources) of(path string) *scriptedSource {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srcs == nil {
		p.srcs = map[string]*scriptedSource{}
	}
	if p.srcs[path] == nil {
		p.srcs[path] = &scriptedSource{}
	}
	return p.srcs[path]
}

func multiStore(t *testing.T, dir string, srcs *perRefSources, max int) *Store {
	t.Helper()
	s, err := NewStore(Config{StateDir: dir, Now: fakeClock(), ReadTimeout: 200 * time.Millisecond, MaxWorkloads: max, Open: srcs.open})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func boundActors(s *Store) []string {
	var out []string
	for _, b := range s.Bindings() {
		out = append(out, b.Identity.ActorUID)
	}
	return out
}

func TestSeveralBindings(t *testing.T) {
	ctx := context.Background()
	srcs := &perRefSources{}
	s := multiStore(t, t.TempDir(), srcs, 3)
	var first []*Binding
	for i := range 3 {
		srcs.of(actorRef(i).CgroupPath).set(reading(uint64(i+1)*1000, uint64(i+1)<<20), nil, false)
		b, replaced, err := s.Bind(ctx, OpRun, actorID(i), actorRef(i))
		if err != nil || replaced != nil {
			t.Fatalf("bind actor %d: %v, replaced %v", i, err, replaced)
		}
		first = append(first, b)
	}
	if diff := cmp.Diff([]string{"actor-0", "actor-1", "actor-2"}, boundActors(s)); diff != "" {
		t.Fatalf("bound (-want +got):\n%s", diff)
	}
	for i, b := range first {
		if s.Bound(actorID(i).ActorUID) != b || b.Source != srcs.of(actorRef(i).CgroupPath) {
			t.Fatalf("actor %d: not its own binding or source", i)
		}
	}

	t.Run("over the ceiling is refused and changes nothing", func(t *testing.T) {
		_, _, err := s.Bind(ctx, OpRun, actorID(3), actorRef(3))
		if !errors.Is(err, ErrTooManyWorkloads) {
			t.Fatalf("err = %v, want ErrTooManyWorkloads", err)
		}
		if diff := cmp.Diff([]string{"actor-0", "actor-1", "actor-2"}, boundActors(s)); diff != "" {
			t.Fatalf("bound (-want +got):\n%s", diff)
		}
	})
	t.Run("a bound actor's new sandbox at the ceiling replaces its own", func(t *testing.T) {
		b, replaced, err := s.Bind(ctx, OpRestore, actorID(2), actorRef(2))
		if err != nil || replaced == nil || replaced.Outcome != OutcomeReplaced || replaced.Identity != actorID(2) {
			t.Fatalf("restore at the ceiling: %v, replaced %+v", err, replaced)
		}
		if s.Bound("actor-0") != first[0] || s.Bound("actor-1") != first[1] || s.Bound("actor-2") != b {
			t.Fatal("the others' bindings changed")
		}
		first[2] = b
	})
	t.Run("checkpoint of one ends it only; a retry returns the same record", func(t *testing.T) {
		e, err := s.Release(ctx, "actor-1")
		if err != nil || e.Identity != actorID(1) || e.Final == nil || *e.Final.CPUUsageUsec != 2000 {
			t.Fatalf("release actor-1: %+v, %v", e, err)
		}
		if s.Bound("actor-0") != first[0] || s.Bound("actor-2") != first[2] || s.Bound("actor-1") != nil {
			t.Fatal("the others' bindings changed")
		}
		// Another actor is released in between: the retry still finds its own.
		if _, err := s.Release(ctx, "actor-0"); err != nil {
			t.Fatal(err)
		}
		again, err := s.Release(ctx, "actor-1")
		if err != nil || again.EpochUnixNano != e.EpochUnixNano {
			t.Fatalf("retry = %+v, %v; want the same record", again, err)
		}
		if _, err := s.Release(ctx, "actor-9"); !errors.Is(err, ErrActorMismatch) {
			t.Fatalf("checkpoint of a never-bound actor beside others: err = %v, want ErrActorMismatch", err)
		}
	})
	t.Run("a freed slot takes a new actor", func(t *testing.T) {
		if _, _, err := s.Bind(ctx, OpRun, actorID(3), actorRef(3)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Bind(ctx, OpRun, actorID(1), actorRef(1)); err != nil {
			t.Fatalf("a released actor binds again: %v", err)
		}
	})
}

func TestRestartKeepsEveryBinding(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srcs := &perRefSources{}
	s := multiStore(t, dir, srcs, 8)
	epochs := map[string]int64{}
	for i := range 4 {
		b, _, err := s.Bind(ctx, OpRun, actorID(i), actorRef(i))
		if err != nil {
			t.Fatal(err)
		}
		epochs[b.Identity.ActorUID] = b.EpochUnixNano
	}
	e, err := s.Release(ctx, "actor-2")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2 := multiStore(t, dir, srcs, 8)
	if diff := cmp.Diff([]string{"actor-0", "actor-1", "actor-3"}, boundActors(s2)); diff != "" {
		t.Fatalf("restored (-want +got):\n%s", diff)
	}
	for _, b := range s2.Bindings() {
		if b.EpochUnixNano != epochs[b.Identity.ActorUID] || !b.Ref.Equal(actorRef(int(b.Identity.ActorUID[len("actor-")]-'0'))) {
			t.Fatalf("restored %+v: not what was bound", b)
		}
	}
	if again, err := s2.Release(ctx, "actor-2"); err != nil || again.EpochUnixNano != e.EpochUnixNano {
		t.Fatalf("checkpoint retry after restart = %+v, %v; want the same record", again, err)
	}
	t.Run("a lower ceiling keeps what is bound and refuses more", func(t *testing.T) {
		s2.Close()
		s3 := multiStore(t, dir, srcs, 2)
		if n := len(s3.Bindings()); n != 3 {
			t.Fatalf("%d restored, want 3", n)
		}
		if _, _, err := s3.Bind(ctx, OpRun, actorID(5), actorRef(5)); !errors.Is(err, ErrTooManyWorkloads) {
			t.Fatalf("err = %v, want ErrTooManyWorkloads", err)
		}
	})
}

// TestVersionOneStateLoads: a binding.json written before several workloads
// (version 1: one binding, one last cleared actor) still loads.
func TestVersionOneStateLoads(t *testing.T) {
	dir := t.TempDir()
	v1 := `{"version": 1, "binding": {"identity": {"actor_uid": "actor-a"}, "ref": {"class": 1, "cgroup_path": "/statstest/a"}, "op": "run", "epoch_unix_nano": 5}, "last_cleared_actor_uid": "actor-b"}`
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	s := multiStore(t, dir, &perRefSources{}, 4)
	b := s.Bound("actor-a")
	if b == nil || b.EpochUnixNano != 5 || b.Ref.CgroupPath != "/statstest/a" {
		t.Fatalf("version 1 binding = %+v", b)
	}
	if e, err := s.Release(context.Background(), "actor-b"); err != nil || e != nil {
		t.Fatalf("version 1's cleared actor: %+v, %v; want a retry with no record kept", e, err)
	}
}

// TestVersionOneEndedLoads: the ended.json a statsd of one binding wrote
// (version 1, the same records) still loads after the upgrade, beside its
// version 1 binding.json. The records the node agent has not polled yet are
// kept, not moved aside as corrupt; and a binding whose end is among them
// (statsd stopped between the two writes of an end) is cleared, not bound
// again as if its acknowledged Checkpoint had not happened.
func TestVersionOneEndedLoads(t *testing.T) {
	dir := t.TempDir()
	// Within the retention of the store's clock (fakeClock).
	const c, a int64 = 1_699_999_900_000_000_000, 1_699_999_950_000_000_000
	for name, content := range map[string]string{
		stateFileName: fmt.Sprintf(`{"version": 1, "binding": {"identity": {"actor_uid": "actor-a"}, "ref": {"class": 1, "cgroup_path": "/statstest/a"}, "op": "run", "epoch_unix_nano": %d}}`, a),
		endedFileName: fmt.Sprintf(`{"version": 1, "ended": [`+
			`{"identity": {"actor_uid": "actor-c"}, "class": 1, "epoch_unix_nano": %d, "end_unix_nano": %d, "outcome": 1, "provenance": 1, "cpu_usec": 700},`+
			`{"identity": {"actor_uid": "actor-a"}, "class": 1, "epoch_unix_nano": %d, "end_unix_nano": %d, "outcome": 1, "provenance": 1, "cpu_usec": 900}]}`,
			c, c+1e9, a, a+1e9),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := multiStore(t, dir, &perRefSources{}, 4)
	var got []string
	for _, e := range s.Ended() {
		got = append(got, fmt.Sprintf("%s epoch %d cpu %d", e.Identity.ActorUID, e.EpochUnixNano, *e.CPUUsec))
	}
	want := []string{fmt.Sprintf("actor-c epoch %d cpu 700", c), fmt.Sprintf("actor-a epoch %d cpu 900", a)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ended activations after the upgrade (-want +got):\n%s", diff)
	}
	if b := s.Bound("actor-a"); b != nil {
		t.Errorf("actor-a bound again (epoch %d) though its end is recorded", b.EpochUnixNano)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "*.corrupt-*")); len(aside) > 0 {
		t.Errorf("moved aside as corrupt: %v", aside)
	}
}

// TestLifecycleOfOneActorDoesNotWaitForAnother: a Checkpoint whose final
// read hangs (a guest agent that stopped answering) holds only its own
// actor: another actor binds and checkpoints meanwhile.
func TestLifecycleOfOneActorDoesNotWaitForAnother(t *testing.T) {
	ctx := context.Background()
	srcs := &perRefSources{}
	s, err := NewStore(Config{StateDir: t.TempDir(), ReadTimeout: 3 * time.Second, Open: srcs.open})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.Bind(ctx, OpRun, actorID(0), actorRef(0)); err != nil {
		t.Fatal(err)
	}
	srcs.of(actorRef(0).CgroupPath).set(source.Reading{}, nil, true)
	hung := make(chan error, 1)
	go func() { _, err := s.Release(ctx, "actor-0"); hung <- err }()
	for !s.InLifecycle("actor-0") {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if _, _, err := s.Bind(ctx, OpRun, actorID(1), actorRef(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "actor-1"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("actor-1's Run and Checkpoint took %s beside actor-0's hung final read", took)
	}
	if err := <-hung; err != nil {
		t.Fatalf("actor-0's checkpoint: %v", err)
	}
}

// TestConcurrentLifecycleOfSeveralActors races Run, Restore and Checkpoint
// of different actors against reads (run with -race): every call either
// succeeds or is refused with a lifecycle error, and the state a restart
// finds is exactly the bindings in memory.
func TestConcurrentLifecycleOfSeveralActors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srcs := &perRefSources{}
	s := multiStore(t, dir, srcs, 6)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Go(func() {
			for n := range 25 {
				var err error
				switch n % 3 {
				case 0:
					_, _, err = s.Bind(ctx, OpRun, actorID(i), actorRef(i))
				case 1:
					_, _, err = s.Bind(ctx, OpRestore, actorID(i), actorRef(i))
				case 2:
					_, err = s.Release(ctx, actorID(i).ActorUID)
				}
				if err != nil && !errors.Is(err, ErrTooManyWorkloads) && !errors.Is(err, ErrActorMismatch) && !errors.Is(err, ErrNoWorkload) {
					t.Errorf("actor %d call %d: %v", i, n, err)
				}
			}
		})
	}
	readers := sync.WaitGroup{}
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			bs, _ := s.Snapshot()
			if len(bs) > 6 {
				t.Errorf("%d bound, over the ceiling of 6", len(bs))
			}
			for _, b := range bs {
				if got := s.Bound(b.Identity.ActorUID); got != nil && got.Identity.ActorUID != b.Identity.ActorUID {
					t.Errorf("Bound(%q) = %q", b.Identity.ActorUID, got.Identity.ActorUID)
				}
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	want := boundActors(s)
	s.Close()
	if diff := cmp.Diff(want, boundActors(multiStore(t, dir, srcs, 6))); diff != "" {
		t.Fatalf("restart found other bindings (-memory +restart):\n%s", diff)
	}
}

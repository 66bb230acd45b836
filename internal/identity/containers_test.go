package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// ctr is a container as a source reads it: CPU (total, user, system) and a
// gauge.
func ctr(id string, cpu uint64) source.Container {
	return source.Container{ID: id, CPUUsageUsec: u64(cpu), CPUUserUsec: u64(cpu / 2), CPUSystemUsec: u64(cpu / 2),
		MemoryCurrentBytes: u64(1 << 20), MemoryIsOwn: true, PidsCurrent: u64(2)}
}

// exitedAs is c as an exited container: its counters, its gauges absent.
func exitedAs(c source.Container) source.Container {
	return source.Container{ID: c.ID, Name: c.Name, CPUUsageUsec: c.CPUUsageUsec, CPUUserUsec: c.CPUUserUsec, CPUSystemUsec: c.CPUSystemUsec,
		Exited: true, Absent: []source.Absent{{Field: "memory_current_bytes", Reason: ReasonExited},
			{Field: "memory_working_set_bytes", Reason: ReasonExited}, {Field: "pids_current", Reason: ReasonExited}}}
}

func withContainers(kind source.Kind, cpu uint64, cs ...source.Container) source.Reading {
	return source.Reading{Kind: kind, CPUUsageUsec: u64(cpu), Containers: cs}
}

// TestActivationExitedContainers: a container seen in the activation and
// missing from a later reading whose list was read is carried exited, its
// counters as last read; a partial reading or one whose list was not read
// exits none; a guest agent's sum keeps an exited container's CPU; names
// from the set win over the runtime's.
func TestActivationExitedContainers(t *testing.T) {
	gv := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", Containers: []source.ContainerRef{{ID: "app", Name: "web"}}}
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: []string{"app", "side"}}
	listNotRead := withContainers(source.KindCgroup, 3000)
	listNotRead.Absent = []source.Absent{{Field: "containers", Reason: "sentry: no answer"}}
	partial := withContainers(source.KindGuestAgent, 2000, ctr("app", 2000))
	partial.UnreadContainers = []source.ContainerError{{ID: "side", Reason: "timeout"}}
	for _, tc := range []struct {
		name  string
		ref   source.SandboxRef
		reads []source.Reading
		want  source.Reading // what the last Observe returns
	}{
		{
			name:  "a gVisor container gone from the state files exits with its last CPU; the set's name wins",
			ref:   gv,
			reads: []source.Reading{withContainers(source.KindCgroup, 1000, named("annotated", ctr("app", 500)), ctr("side", 100)), withContainers(source.KindCgroup, 2000, ctr("app", 900))},
			want:  withContainers(source.KindCgroup, 2000, named("web", ctr("app", 900)), exitedAs(ctr("side", 100))),
		},
		{
			name: "a reading whose list was not read exits none",
			ref:  gv,
			reads: []source.Reading{withContainers(source.KindCgroup, 1000, ctr("app", 500), ctr("side", 100)), listNotRead,
				withContainers(source.KindCgroup, 4000, ctr("app", 900), ctr("side", 300))},
			want: withContainers(source.KindCgroup, 4000, named("web", ctr("app", 900)), ctr("side", 300)),
		},
		{
			name:  "an unread container is still there",
			ref:   vm,
			reads: []source.Reading{withContainers(source.KindGuestAgent, 1100, ctr("app", 1000), ctr("side", 100)), partial},
			want:  partial,
		},
		{
			name:  "a guest agent's sum keeps the exited container's CPU",
			ref:   vm,
			reads: []source.Reading{withContainers(source.KindGuestAgent, 1100, ctr("app", 1000), ctr("side", 100)), withContainers(source.KindGuestAgent, 2000, ctr("app", 2000))},
			want:  withContainers(source.KindGuestAgent, 2100, ctr("app", 2000), exitedAs(ctr("side", 100))),
		},
		{
			name: "a container listed again is live again",
			ref:  gv,
			reads: []source.Reading{withContainers(source.KindCgroup, 1000, ctr("app", 500), ctr("side", 100)), withContainers(source.KindCgroup, 2000, ctr("app", 900)),
				withContainers(source.KindCgroup, 3000, ctr("app", 900), ctr("side", 150))},
			want: withContainers(source.KindCgroup, 3000, named("web", ctr("app", 900)), ctr("side", 150)),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newActivation(tc.ref, 1, nil)
			var got source.Reading
			for i, r := range tc.reads {
				got = a.Observe(r, int64(i+1))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			last, _, _ := a.snapshot()
			if diff := cmp.Diff(tc.want, last.Reading); diff != "" {
				t.Errorf("the last good reading as the end carries it (-want +got):\n%s", diff)
			}
		})
	}
}

// TestActivationSetContainers: a micro-VM's container dropped from the set
// exits at once with its last figures; a gVisor set only names.
func TestActivationSetContainers(t *testing.T) {
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: []string{"app", "side"}}
	a := newActivation(vm, 1, nil)
	a.Observe(withContainers(source.KindGuestAgent, 1100, ctr("app", 1000), ctr("side", 100)), 1)
	if !a.SetContainers([]source.ContainerRef{{ID: "app", Name: "web"}, {ID: "new"}}) {
		t.Fatal("dropping a container read before exited none")
	}
	got := a.Observe(withContainers(source.KindGuestAgent, 2050, ctr("app", 2000), ctr("new", 50)), 2)
	want := withContainers(source.KindGuestAgent, 2150, named("web", ctr("app", 2000)), ctr("new", 50), exitedAs(ctr("side", 100)))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	gv := newActivation(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, 1, nil)
	gv.Observe(withContainers(source.KindCgroup, 1000, ctr("app", 500)), 1)
	gv.SetContainers([]source.ContainerRef{{ID: "app", Name: "web"}})
	if gv.SetContainers(nil) {
		t.Error("a gVisor set dropping a name exited the container the state files still list")
	}
}

func named(name string, c source.Container) source.Container { c.Name = name; return c }

// TestActivationEndWithoutList: a final reading that could not list the
// containers (the sandbox gone with its sentry) still carries those live
// at the last read, exited with their last figures; a final that lists
// them exits none.
func TestActivationEndWithoutList(t *testing.T) {
	gv := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", Containers: []source.ContainerRef{{ID: "app", Name: "web"}}}
	listNotRead := withContainers(source.KindCgroup, 3000)
	listNotRead.Absent = []source.Absent{{Field: "containers", Reason: "sentry: no socket"}}
	for _, tc := range []struct {
		name  string
		final source.Reading
		want  source.Reading
	}{
		{"list not read", listNotRead, source.Reading{Kind: source.KindCgroup, CPUUsageUsec: u64(3000), Absent: listNotRead.Absent,
			Containers: []source.Container{exitedAs(named("web", ctr("app", 500))), exitedAs(ctr("side", 100))}}},
		{"list read", withContainers(source.KindCgroup, 3000, ctr("app", 800), ctr("side", 200)),
			withContainers(source.KindCgroup, 3000, named("web", ctr("app", 800)), ctr("side", 200))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newActivation(gv, 1, nil)
			a.Observe(withContainers(source.KindCgroup, 1000, ctr("app", 500), ctr("side", 100)), 1)
			got := a.ObserveEnd(tc.final, 2)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("the final (-want +got):\n%s", diff)
			}
		})
	}
}

// TestActivationExitedFolded: past MaxExited the oldest exited containers
// fold into one entry whose counters are their sums, so the containers'
// sum stays; its name is fixed, the count in its gauges' absent reason.
func TestActivationExitedFolded(t *testing.T) {
	a := newActivation(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, 1, nil)
	const n = 40
	var total uint64
	for i := range n {
		c := ctr(fmt.Sprintf("c%02d", i), uint64(1000+i))
		total += 1000 + uint64(i)
		a.Observe(withContainers(source.KindCgroup, 1, c), int64(2*i+1))
	}
	got := a.Observe(withContainers(source.KindCgroup, 1), 2*n+1)
	if len(got.Containers) != MaxExited {
		t.Fatalf("%d containers, want %d", len(got.Containers), MaxExited)
	}
	var sum uint64
	for _, c := range got.Containers {
		if !c.Exited {
			t.Errorf("%s not exited", c.ID)
		}
		sum += *c.CPUUsageUsec
	}
	if sum != total {
		t.Errorf("the exited containers' CPU sums to %d, want %d", sum, total)
	}
	f := got.Containers[0]
	folded := n - (MaxExited - 1)
	if f.ID != FoldedExitedID || f.Name != FoldedExitedID {
		t.Errorf("first entry %q %q, want %q (a fixed name)", f.ID, f.Name, FoldedExitedID)
	}
	for _, x := range f.Absent {
		if n, ok := FoldedCount(x.Reason); !ok || n != folded {
			t.Errorf("folded entry's %s absent %q: %d containers, want %d", x.Field, x.Reason, n, folded)
		}
	}
	if last := got.Containers[MaxExited-1]; last.ID != fmt.Sprintf("c%02d", n-1) {
		t.Errorf("newest exited is %q", last.ID)
	}
}

// TestContainerSetRetryAndUpdate: a Run repeated with another set is a
// retry that updates it (same binding, epoch, source); UpdateContainers
// too, validated for the class; a restart keeps the set and the exited
// containers, and a state file with too many exited ones is refused.
func TestContainerSetRetryAndUpdate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := &setterSource{}
	var opens int
	cfg := Config{StateDir: dir, Now: fakeClock(), Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) {
		opens++
		return src, nil, nil
	}}
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1024", Containers: []source.ContainerRef{{ID: "app", Name: "web"}, {ID: "side"}}}
	b, _, err := s.Bind(ctx, OpRun, idA, ref)
	if err != nil {
		t.Fatal(err)
	}
	src.set(withContainers(source.KindGuestAgent, 1100, ctr("app", 1000), ctr("side", 100)))
	b.Activation.Observe(src.reading, 5)

	retry := ref
	retry.Containers = []source.ContainerRef{{ID: "app", Name: "web"}}
	b2, replaced, err := s.Bind(ctx, OpRun, idA, retry)
	if err != nil || b2 != b || replaced != nil || opens != 1 {
		t.Fatalf("retry with another set: binding kept %v, replaced %v, opens %d, err %v", b2 == b, replaced, opens, err)
	}
	if diff := cmp.Diff(retry.Containers, src.lastSet()); diff != "" {
		t.Errorf("the source's set (-want +got):\n%s", diff)
	}
	for _, bad := range [][]source.ContainerRef{
		nil, // a micro-VM reads at least one
		{{ID: "a"}, {ID: "a"}},
		{{ID: strings.Repeat("x", 129)}},
		{{ID: "a b"}},
		{{ID: "a", Name: "tab\there"}},
		{{ID: "a", Name: strings.Repeat("n", 254)}},
		make26(),
	} {
		if _, err := s.UpdateContainers(ctx, "actor-a", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("set %v: err %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := s.UpdateContainers(ctx, "actor-x", []source.ContainerRef{{ID: "a"}}); !errors.Is(err, ErrActorMismatch) {
		t.Errorf("unknown actor: %v", err)
	}
	set := []source.ContainerRef{{ID: "app", Name: "web"}, {ID: "added", Name: "sidecar"}}
	if got, err := s.UpdateContainers(ctx, "actor-a", set); err != nil || got != b {
		t.Fatalf("update: %v", err)
	}
	waitFor(t, func() bool { return strings.Contains(readFile(t, filepath.Join(dir, stateFileName)), `"exited"`) })
	s.Close()

	s2, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	r := s2.Bound("actor-a")
	if r == nil || r.EpochUnixNano != b.EpochUnixNano {
		t.Fatal("the binding did not survive the restart")
	}
	if diff := cmp.Diff(set, r.Activation.Containers()); diff != "" {
		t.Errorf("set after the restart (-want +got):\n%s", diff)
	}
	got := r.Activation.Observe(withContainers(source.KindGuestAgent, 3000, ctr("app", 2950), ctr("added", 50)), 10)
	want := withContainers(source.KindGuestAgent, 3100, named("web", ctr("app", 2950)), named("sidecar", ctr("added", 50)), exitedAs(ctr("side", 100)))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("a sample after the restart (-want +got):\n%s", diff)
	}
}

func make26() []source.ContainerRef {
	var out []source.ContainerRef
	for i := range MaxContainerIDs + 1 {
		out = append(out, source.ContainerRef{ID: fmt.Sprintf("c%d", i)})
	}
	return out
}

// TestStateRefusesTooManyExited: a state file is validated like a call.
func TestStateRefusesTooManyExited(t *testing.T) {
	var ex exitedState
	for i := range MaxExited + 1 {
		ex.Containers = append(ex.Containers, source.Container{ID: fmt.Sprintf("c%d", i), Exited: true})
	}
	if err := validateExited(ex); err == nil {
		t.Error("26 exited containers validated")
	}
	if err := validateExited(exitedState{Containers: ex.Containers[:MaxExited]}); err != nil {
		t.Error(err)
	}
}

// setterSource is a Source whose set can change (as the guest agent's).
type setterSource struct {
	mu      sync.Mutex
	reading source.Reading
	sets    [][]source.ContainerRef
}

func (f *setterSource) Sample(context.Context) (source.Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reading, nil
}
func (f *setterSource) Close() error { return nil }
func (f *setterSource) set(r source.Reading) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reading = r
}
func (f *setterSource) SetContainers(set []source.ContainerRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, set)
}
func (f *setterSource) lastSet() []source.ContainerRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil
	}
	return f.sets[len(f.sets)-1]
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

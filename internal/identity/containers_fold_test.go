package identity

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestSnapshotCountsExitedContainerOnce: the end's last good poll (snapshot)
// adds an exited container's CPU to a guest agent's sum only where that
// reading's sum lacks it. The reviewer's case (31b-review finding 2): the
// reading lists "side" (3000 in its sum), then the set drops it: 6000, not
// 9000. The ordinary case: "side" exited at a later reading, whose sum no
// longer holds it: added once (3000 + 3000). A merged entry (a restart
// under the same name) adds its predecessor's CPU, not the newest's twice.
func TestSnapshotCountsExitedContainerOnce(t *testing.T) {
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: []string{"sbx", "app", "side"}}
	for _, tc := range []struct {
		name string
		run  func(a *Activation)
		want uint64
	}{
		{"dropped by the set after the last reading", func(a *Activation) {
			a.Observe(withContainers(source.KindGuestAgent, 6000, ctr("sbx", 1000), ctr("app", 2000), ctr("side", 3000)), 10)
			a.SetContainers([]source.ContainerRef{{ID: "sbx"}, {ID: "app"}})
		}, 6000},
		{"exited at an earlier reading", func(a *Activation) {
			a.Observe(withContainers(source.KindGuestAgent, 6000, ctr("sbx", 1000), ctr("app", 2000), ctr("side", 3000)), 10)
			a.Observe(withContainers(source.KindGuestAgent, 3000, ctr("sbx", 1000), ctr("app", 2000)), 20)
		}, 6000},
		{"restarted under its name, then dropped", func(a *Activation) {
			a.SetContainers([]source.ContainerRef{{ID: "sbx"}, {ID: "app", Name: "web"}})
			a.Observe(withContainers(source.KindGuestAgent, 3000, ctr("sbx", 1000), ctr("app", 2000)), 10)
			a.SetContainers([]source.ContainerRef{{ID: "sbx"}, {ID: "app2", Name: "web"}})
			a.Observe(withContainers(source.KindGuestAgent, 1500, ctr("sbx", 1000), ctr("app2", 500)), 20)
			a.SetContainers([]source.ContainerRef{{ID: "sbx"}})
		}, 3500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newActivation(vm, 1, nil)
			tc.run(a)
			last, _, _ := a.snapshot()
			var sum uint64
			for _, c := range last.Reading.Containers {
				sum += *c.CPUUsageUsec
			}
			if got := *last.Reading.CPUUsageUsec; got != tc.want || sum != tc.want {
				t.Errorf("final CPU %d, its containers sum to %d; want both %d", got, sum, tc.want)
			}
		})
	}
}

// TestExitedMergedByName: a container that exits under the name of an
// exited one (CrashLoopBackOff: 40 runs of "app", each a new id) is merged
// into that entry: one entry, the newest id, the counters summed, nothing
// folded; the cap counts distinct names: 30 other names fold into the
// folded entry (7: app and 6 jobs), whose name is fixed and whose count is its reason's.
func TestExitedMergedByName(t *testing.T) {
	a := newActivation(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, 1, nil)
	var at int64
	observe := func(cs ...source.Container) source.Reading {
		at++
		return a.Observe(withContainers(source.KindCgroup, 1, cs...), at)
	}
	var total, app uint64
	for i := range 40 {
		c := named("app", ctr(fmt.Sprintf("app-%02d", i), 100))
		observe(c)
		total += 100
		app += 100
		got := observe()
		if len(got.Containers) != 1 || got.Containers[0].ID != c.ID || *got.Containers[0].CPUUsageUsec != app {
			t.Fatalf("run %d: %+v, want one exited entry %s of %d", i, got.Containers, c.ID, app)
		}
	}
	if a.exitedNow().Folded != 0 {
		t.Fatalf("%d folded after restarts of one name", a.exitedNow().Folded)
	}
	for i := range 30 {
		observe(named(fmt.Sprintf("job-%02d", i), ctr(fmt.Sprintf("job-%02d", i), 10)))
		total += 10
	}
	got := observe()
	if len(got.Containers) != MaxExited {
		t.Fatalf("%d entries, want %d", len(got.Containers), MaxExited)
	}
	var sum uint64
	for _, c := range got.Containers {
		sum += *c.CPUUsageUsec
	}
	f := got.Containers[0]
	n, ok := FoldedCount(f.Absent[len(f.Absent)-1].Reason)
	if sum != total || f.ID != FoldedExitedID || f.Name != FoldedExitedID || !ok || n != 7 || *f.CPUUsageUsec != app+6*10 {
		t.Errorf("sum %d (want %d); first entry %q %q %d, %d folded (want %q, 7, %d)", sum, total, f.ID, f.Name, *f.CPUUsageUsec, n, FoldedExitedID, app+60)
	}
}

// TestCloseWritesPendingExit (31b-review finding 9): an exit whose write
// persistExited had not made when it stopped (a wake pending as the store
// closes) is written by Close, and a new store on the same dir carries it.
// The writer is stopped first, so the wake is pending whatever select picks.
func TestCloseWritesPendingExit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := &setterSource{}
	cfg := Config{StateDir: dir, Now: fakeClock(), Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) {
		return src, nil, nil
	}}
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}
	b, _, err := s.Bind(ctx, OpRun, idA, ref)
	if err != nil {
		t.Fatal(err)
	}
	b.Activation.Observe(withContainers(source.KindCgroup, 500, ctr("app", 300), ctr("side", 200)), 5)
	s.bgStop()
	s.bg.Wait() // persistExited stopped: the next wake stays pending
	b.Activation.Observe(withContainers(source.KindCgroup, 600, ctr("app", 400)), 6)
	if strings.Contains(readFile(t, dir+"/"+stateFileName), `"side"`) {
		t.Fatal("side written before Close: the test does not hold the window")
	}
	s.Close()

	s2, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got := s2.Bound("actor-a").Activation.exitedNow().Containers
	if !slices.ContainsFunc(got, func(c source.Container) bool { return c.ID == "side" }) {
		t.Errorf("after the restart the exited containers are %v, want side's", got)
	}
	if diff := cmp.Diff([]source.Container{{ID: "side", CPUUsageUsec: u64(200), CPUUserUsec: u64(100), CPUSystemUsec: u64(100), Exited: true}}, got); diff != "" {
		t.Errorf("exited after the restart (-want +got):\n%s", diff)
	}
}

// TestMergedListedAgain: a container merged into the exited entry of its
// name and then listed again (a read that began before it exited) is live
// again, and its predecessor stays exited with its own CPU: the sum is
// kept (1000 + 610), through a restart (binding.json) too.
func TestMergedListedAgain(t *testing.T) {
	a := newActivation(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, 1, nil)
	a.Observe(withContainers(source.KindCgroup, 1, named("app", ctr("a1", 1000))), 1)
	a.Observe(withContainers(source.KindCgroup, 1), 2)
	a.Observe(withContainers(source.KindCgroup, 1, named("app", ctr("a2", 500))), 3)
	a.Observe(withContainers(source.KindCgroup, 1), 4)
	if err := validateExited(a.exitedNow()); err != nil {
		t.Fatal(err)
	}
	b := newActivation(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, 1, nil)
	b.restoreExited(nil, a.exitedNow())
	for name, act := range map[string]*Activation{"in memory": a, "restored": b} {
		got := act.Observe(withContainers(source.KindCgroup, 1, named("app", ctr("a2", 610))), 5)
		want := withContainers(source.KindCgroup, 1, named("app", ctr("a2", 610)), exitedAs(named("app", ctr("a1", 1000))))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: a2 listed again (-want +got):\n%s", name, diff)
		}
	}
}

package drift

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// perActorObserver answers each binding's observation from its own script.
type perActorObserver map[string]Observation

func (p perActorObserver) Observe(_ context.Context, b *identity.Binding) Observation {
	return p[b.Identity.ActorUID]
}

// TestSeveralWorkloadsChecked: every binding is observed and its findings
// are its own; one in its grace is skipped alone; a checkpointed one's
// findings are dropped alone; a hostile one's flood of findings is capped at
// its own 64, leaving room for its neighbours'.
func TestSeveralWorkloadsChecked(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	store, err := identity.NewStore(identity.Config{Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	bind := func(actor string) {
		t.Helper()
		if _, _, err := store.Bind(ctx, identity.OpRun, identity.Identity{ActorUID: actor}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/pod/" + actor + "-_pause"}); err != nil {
			t.Fatal(err)
		}
	}
	bind("actor-a")
	bind("actor-b")
	bind("hostile")
	var flood []Finding
	for i := range 200 {
		flood = append(flood, Finding{Kind: KindStrayVMM, Subject: fmt.Sprintf("pid %d", 1000+i), Detail: "claims a guest name"})
	}
	o := perActorObserver{
		"actor-a": obs(all, nil, dead),
		"actor-b": obs(all, nil),
		"hostile": obs(all, nil, flood...),
		"late":    obs(all, nil, vmmGone),
	}
	var logs bytes.Buffer
	c, err := New(Config{Store: store, Observer: o, Interval: time.Minute, Grace: 15 * time.Minute, Now: clock.now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Hour) // past the grace of the three
	bind("late")             // within its grace
	c.Cycle(ctx)

	counts := map[string]uint32{}
	for _, a := range []string{"actor-a", "actor-b", "hostile", "late"} {
		counts[a] = c.OpenCount(a)
	}
	if diff := cmp.Diff(map[string]uint32{"actor-a": 1, "actor-b": 0, "hostile": maxOpenFindings, "late": 0}, counts); diff != "" {
		t.Fatalf("open findings per actor (-want +got):\n%s", diff)
	}
	st := c.Status()
	for _, want := range []string{"actor-a: checked", "actor-b: checked", "hostile: checked; 136 more findings not recorded", "late: skipped: within grace"} {
		if !strings.Contains(st.Outcome, want) {
			t.Errorf("status %q lacks %q", st.Outcome, want)
		}
	}

	if _, err := store.Release(ctx, "hostile"); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Hour)
	c.Cycle(ctx)
	counts = map[string]uint32{}
	for _, a := range []string{"actor-a", "hostile", "late"} {
		counts[a] = c.OpenCount(a)
	}
	if diff := cmp.Diff(map[string]uint32{"actor-a": 1, "hostile": 0, "late": 1}, counts); diff != "" {
		t.Fatalf("after the hostile one's checkpoint (-want +got):\n%s", diff)
	}
	for _, f := range c.Open() {
		if f.ActorUID == "actor-a" && f.Kind != KindSandboxDead || f.ActorUID == "late" && f.Kind != KindVMMGone {
			t.Errorf("finding %+v is not its actor's", f)
		}
	}
}

// TestFindingsBoundedAcrossWorkloads: 63 hostile workloads flood findings at
// the longest subject and detail beside one good workload. The open findings
// stay within the total a node agent takes from one answer, each workload
// gets its share, and drift.json keeps them all across a restart (before
// the per-workload share, 64 each overflowed the file's cap and a restart
// moved it aside: every workload's findings lost).
func TestFindingsBoundedAcrossWorkloads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	store, err := identity.NewStore(identity.Config{Now: clock.now, MaxWorkloads: identity.LimitMaxWorkloads})
	if err != nil {
		t.Fatal(err)
	}
	o := perActorObserver{"good": obs(all, nil, vmmGone)}
	bind := func(actor string) {
		t.Helper()
		if _, _, err := store.Bind(ctx, identity.OpRun, identity.Identity{ActorUID: actor}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/pod/" + actor}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range identity.LimitMaxWorkloads - 1 {
		actor := fmt.Sprintf("hostile-%02d", i)
		bind(actor)
		var flood []Finding
		for k := range 200 {
			flood = append(flood, Finding{Kind: KindStrayVMM, Subject: fmt.Sprintf("pid %d ", k) + strings.Repeat("s", maxSubjectBytes),
				Detail: strings.Repeat("d", maxDetailBytes)})
		}
		o[actor] = obs(all, nil, flood...)
	}
	bind("good")
	c, err := New(Config{Store: store, Observer: o, Interval: time.Minute, StateDir: dir, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Hour)
	c.Cycle(ctx)
	if n := len(c.Open()); n > maxOpenFindingsTotal {
		t.Fatalf("%d open findings, over the total of %d", n, maxOpenFindingsTotal)
	}
	if got := c.OpenCount("good"); got != 1 {
		t.Fatalf("the good workload has %d open findings, want 1", got)
	}
	restarted, err := New(Config{Store: store, Observer: o, Interval: time.Minute, StateDir: dir, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c.Open(), restarted.Open()); diff != "" {
		t.Fatalf("open findings after a restart (-before +after):\n%s", diff)
	}
	fi, err := os.Stat(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d workloads: %d open findings (%d each at most), drift.json %d bytes", identity.LimitMaxWorkloads, len(c.Open()), openCap(identity.LimitMaxWorkloads), fi.Size())
}

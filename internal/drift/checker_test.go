package drift

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// scriptedObserver returns the next scripted observation each cycle.
type scriptedObserver struct {
	script []Observation
	calls  atomic.Int32
}

func (s *scriptedObserver) Observe(context.Context, *identity.Binding) Observation {
	n := int(s.calls.Add(1)) - 1
	if n >= len(s.script) {
		n = len(s.script) - 1
	}
	return s.script[n]
}

// fakeClock is a manual clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

var (
	vmmGone = Finding{Kind: KindVMMGone, Subject: "pid 4242", Detail: "gone"}
	dead    = Finding{Kind: KindSandboxDead, Subject: "/statstest", Detail: "no processes"}
)

func obs(ran []comparison, skipped map[comparison]string, findings ...Finding) Observation {
	o := newObservation()
	for _, c := range ran {
		o.ran(c)
	}
	for c, why := range skipped {
		o.skip(c, why)
	}
	o.Findings = findings
	return o
}

var all = []comparison{cmpCgroup, cmpSentry, cmpVMM, cmpStray}

type fixture struct {
	store   *identity.Store
	clock   *fakeClock
	obs     *scriptedObserver
	checker *Checker
	logs    *bytes.Buffer
	dir     string
}

func newFixture(t *testing.T, dir string, script ...Observation) *fixture {
	t.Helper()
	f := &fixture{clock: &fakeClock{t: time.Unix(1_800_000_000, 0)}, obs: &scriptedObserver{script: script}, logs: &bytes.Buffer{}, dir: dir}
	store, err := identity.NewStore(identity.Config{Now: f.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	f.store = store
	if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "actor-a"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest"}); err != nil {
		t.Fatal(err)
	}
	f.checker = f.newChecker(t)
	f.clock.advance(time.Hour) // past the grace
	return f
}

func (f *fixture) newChecker(t *testing.T) *Checker {
	t.Helper()
	c, err := New(Config{
		Store: f.store, Observer: f.obs, Interval: time.Minute, Grace: 15 * time.Minute, StateDir: f.dir,
		Now: f.clock.now, Logger: slog.New(slog.NewTextHandler(f.logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) cycle() {
	f.checker.Cycle(context.Background())
	f.clock.advance(time.Minute)
}

func eventTypes(c *Checker) []string {
	var out []string
	for _, e := range c.Events() {
		out = append(out, e.Type.String()+" "+e.Finding.Kind.String()+" "+e.Finding.Subject)
	}
	return out
}

func TestBaselineNoFindingsNoEvents(t *testing.T) {
	f := newFixture(t, t.TempDir(), obs(all, nil))
	for range 3 {
		f.cycle()
	}
	if ev := f.checker.Events(); len(ev) != 0 {
		t.Fatalf("events = %v, want none", ev)
	}
	if st := f.checker.Status(); st.Outcome != "checked" {
		t.Fatalf("outcome = %q", st.Outcome)
	}
	if _, err := os.Stat(filepath.Join(f.dir, stateFileName)); !os.IsNotExist(err) {
		t.Error("state written although nothing changed")
	}
}

func TestFindingReportedOnceAndClearedOnce(t *testing.T) {
	f := newFixture(t, t.TempDir(), obs(all, nil, dead), obs(all, nil, dead), obs(all, nil, dead), obs(all, nil))
	for range 4 {
		f.cycle()
	}
	want := []string{"OPENED SANDBOX_DEAD /statstest", "CLEARED SANDBOX_DEAD /statstest"}
	if diff := cmp.Diff(want, eventTypes(f.checker)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := strings.Count(f.logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d WARN lines, want 1:\n%s", n, f.logs)
	}
	if n := strings.Count(f.logs.String(), "matches again"); n != 1 {
		t.Errorf("%d INFO 'matches again' lines, want 1:\n%s", n, f.logs)
	}
}

func TestUnreadableSideKeepsItsFindings(t *testing.T) {
	skipVMM := map[comparison]string{cmpVMM: "read timed out: /run/srv1/qemu.pid"}
	f := newFixture(t, t.TempDir(),
		obs(all, nil, vmmGone),
		obs([]comparison{cmpCgroup, cmpSentry, cmpStray}, skipVMM), // VMM side unreadable
		obs([]comparison{cmpCgroup, cmpSentry, cmpStray}, skipVMM),
		obs(all, nil), // readable again, and fixed
	)
	f.cycle()
	f.cycle()
	f.cycle()
	if got := f.checker.Open(); len(got) != 1 {
		t.Fatalf("open findings while unreadable = %v, want the VMM finding kept", got)
	}
	if st := f.checker.Status(); len(st.Skipped) != 1 || !strings.Contains(st.Skipped[0], "vmm process") {
		t.Fatalf("status does not say which comparison was skipped: %+v", st)
	}
	if diff := cmp.Diff([]string{"OPENED VMM_GONE pid 4242"}, eventTypes(f.checker)); diff != "" {
		t.Fatalf("events while unreadable (-want +got):\n%s", diff)
	}
	f.cycle()
	if diff := cmp.Diff([]string{"OPENED VMM_GONE pid 4242", "CLEARED VMM_GONE pid 4242"}, eventTypes(f.checker)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestSkipsMidOperationAndWithinGrace(t *testing.T) {
	f := newFixture(t, "", obs(all, nil, dead))
	release := f.store.HoldLifecycle("actor-a")
	f.cycle()
	release()
	if f.obs.calls.Load() != 0 || !strings.Contains(f.checker.Status().Outcome, "lifecycle") {
		t.Fatalf("cycle during a lifecycle call observed (%d calls, %q)", f.obs.calls.Load(), f.checker.Status().Outcome)
	}
	// A Restore starts a new epoch: the grace applies again.
	if _, _, err := f.store.Bind(context.Background(), identity.OpRestore, identity.Identity{ActorUID: "actor-a"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest"}); err != nil {
		t.Fatal(err)
	}
	f.cycle()
	if f.obs.calls.Load() != 0 || !strings.Contains(f.checker.Status().Outcome, "grace") {
		t.Fatalf("young sandbox observed (%d calls, %q)", f.obs.calls.Load(), f.checker.Status().Outcome)
	}
	f.clock.advance(15 * time.Minute)
	f.cycle()
	if f.obs.calls.Load() != 1 {
		t.Fatal("not observed after the grace")
	}
}

func TestOffMeansNoReads(t *testing.T) {
	f := newFixture(t, "", obs(all, nil, dead))
	c, err := New(Config{Store: f.store, Observer: f.obs, Interval: 0})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Run with interval 0 did not return at once")
	}
	if f.obs.calls.Load() != 0 {
		t.Fatal("the check read something while off")
	}
	if c.Status().Enabled {
		t.Fatal("status says enabled")
	}
}

func TestRestartNeitherReReportsNorForgets(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, obs(all, nil, dead))
	f.cycle()
	// statsd restarts: a new checker on the same state dir.
	f.checker = f.newChecker(t)
	if got := f.checker.Open(); len(got) != 1 || got[0].Kind != KindSandboxDead {
		t.Fatalf("after restart open = %v, want the dead-sandbox finding", got)
	}
	f.logs.Reset()
	f.cycle()
	if strings.Contains(f.logs.String(), "level=WARN") {
		t.Fatalf("re-reported after restart:\n%s", f.logs)
	}
	if n := len(f.checker.Events()); n != 1 {
		t.Fatalf("%d events after restart, want the one from before", n)
	}
	if f.checker.OpenCount("actor-a") != 1 || f.checker.OpenCount("actor-b") != 0 {
		t.Fatal("OpenCount wrong")
	}
}

func TestCheckpointDropsFindings(t *testing.T) {
	f := newFixture(t, "", obs(all, nil, dead))
	f.cycle()
	if _, err := f.store.Release(context.Background(), "actor-a"); err != nil {
		t.Fatal(err)
	}
	f.cycle()
	if len(f.checker.Open()) != 0 {
		t.Fatal("finding outlived its workload")
	}
	if diff := cmp.Diff([]string{"OPENED SANDBOX_DEAD /statstest", "DROPPED SANDBOX_DEAD /statstest"}, eventTypes(f.checker)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestCorruptStateMovedAside(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, dir, obs(all, nil))
	if len(f.checker.Open()) != 0 {
		t.Fatal("findings from a corrupt file")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, stateFileName+".corrupt-*")); len(m) != 1 {
		t.Fatalf("moved aside: %v", m)
	}
}

func TestNewEpochDropsFindings(t *testing.T) {
	f := newFixture(t, "", obs(all, nil, dead))
	f.cycle()
	if _, _, err := f.store.Bind(context.Background(), identity.OpRestore, identity.Identity{ActorUID: "actor-a"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest"}); err != nil {
		t.Fatal(err)
	}
	f.cycle() // within the new epoch's grace: the old epoch's finding is dropped
	if n := f.checker.OpenCount("actor-a"); n != 0 {
		t.Fatalf("%d findings of the old epoch still open", n)
	}
	if diff := cmp.Diff([]string{"OPENED SANDBOX_DEAD /statstest", "DROPPED SANDBOX_DEAD /statstest"}, eventTypes(f.checker)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestUnknownKindFromANewerStateFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, stateFileName), []byte(`{"version":1,"findings":[{"kind":99,"subject":"x","actor_uid":"someone-else"}]}`), 0o600)
	f := newFixture(t, dir, obs(all, nil))
	f.cycle() // drops the other actor's finding and logs it: must not panic
	if got := eventTypes(f.checker); len(got) != 1 || !strings.HasPrefix(got[0], "DROPPED KIND(99) x") {
		t.Fatalf("events = %q", got)
	}
}

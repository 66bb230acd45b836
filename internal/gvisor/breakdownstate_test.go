package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/sentryusage"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// restarted is a new breakdown continued from b's persisted state (a JSON
// round trip through the source's methods), as a restarted statsd's.
func restarted(t *testing.T, b *breakdown) *breakdown {
	t.Helper()
	st, err := (&cgroupSource{bd: b}).BreakdownState()
	if err != nil || st == nil {
		t.Fatalf("state %q, %v", st, err)
	}
	if len(st) > source.MaxBreakdownStateBytes {
		t.Fatalf("%d bytes", len(st))
	}
	nb := &breakdown{own: newOwnTracker(t.TempDir())}
	if err := (&cgroupSource{bd: nb}).RestoreBreakdownState(st); err != nil {
		t.Fatal(err)
	}
	return nb
}

// podSample is one breakdown sample of sandbox "sbx" (pause "sbx", the
// application containers raw, in sentry ns) with cgroup usec and own
// processes' usec; it returns the application containers' figures and the
// own share.
func podSample(b *breakdown, cgroup, procs uint64, raw map[string]uint64) (map[string]uint64, uint64) {
	cs := []runscState{{ID: "sbx", SandboxID: "sbx", Type: "sandbox"}}
	cpu := map[string]uint64{"sbx": 1e6}
	for id, v := range raw {
		cs = append(cs, runscState{ID: id, SandboxID: "sbx", Type: "container", Name: id})
		cpu[id] = v
	}
	r := source.Reading{CPUUsageUsec: &cgroup}
	b.addContainers(&r, containerRead{sb: runscSandbox{ID: "sbx", Containers: cs}, usage: sentryusage.Usage{CPU: cpu}, own: ownRead{Usec: procs}}, nil)
	out := map[string]uint64{}
	for _, c := range r.Containers {
		out[c.ID] = *c.CPUUsageUsec
	}
	return out, *r.SandboxOwnCPUUsec
}

// TestSplitRestartContinues: the review's proofs (a counter down across a
// restart, an exited container's CPU given to the live ones) hold no more
// with the splitter continued from its persisted state.
func TestSplitRestartContinues(t *testing.T) {
	roundTrip := func(s *splitter) *splitter {
		var st breakdownState
		st.Version = breakdownStateVersion
		if !s.exportState(&st) {
			t.Fatal("no state")
		}
		b, _ := json.Marshal(st)
		d, err := decodeBreakdownState(b)
		if err != nil {
			t.Fatal(err)
		}
		var n splitter
		n.restoreState(d)
		return &n
	}
	t.Run("counter not down", func(t *testing.T) {
		var s splitter
		s.advance(splitInput{SandboxID: "s", CgroupUsec: 1000, OwnUsec: 500, Raw: map[string]uint64{"A": 100, "B": 100}})
		a1, _ := s.advance(splitInput{SandboxID: "s", CgroupUsec: 2000, OwnUsec: 500, Raw: map[string]uint64{"A": 1100, "B": 100}})
		a2, _ := roundTrip(&s).advance(splitInput{SandboxID: "s", CgroupUsec: 2000, OwnUsec: 500, Raw: map[string]uint64{"A": 1100, "B": 100}})
		if a2["B"] < a1["B"] || a2["A"] < a1["A"] {
			t.Errorf("went down across a restart: %v -> %v", a1, a2)
		}
	})
	t.Run("exited not counted twice", func(t *testing.T) {
		var s splitter
		a1, _ := s.advance(splitInput{SandboxID: "s", CgroupUsec: 10_000, Raw: map[string]uint64{"A": 9_900, "B": 100}})
		s.advance(splitInput{SandboxID: "s", CgroupUsec: 10_000, Raw: map[string]uint64{"B": 100}}) // A exited
		a2, _ := roundTrip(&s).advance(splitInput{SandboxID: "s", CgroupUsec: 10_000, Raw: map[string]uint64{"B": 100}})
		if a1["A"]+a2["B"] > 10_000 || a2["B"] != a1["B"] {
			t.Errorf("A kept %d + B %d (was %d) > the cgroup's 10000", a1["A"], a2["B"], a1["B"])
		}
	})
	t.Run("another sandbox id starts afresh", func(t *testing.T) {
		var s splitter
		s.advance(splitInput{SandboxID: "s", CgroupUsec: 10_000, Raw: map[string]uint64{"A": 9_900}})
		a, _ := roundTrip(&s).advance(splitInput{SandboxID: "other", CgroupUsec: 300, Raw: map[string]uint64{"X": 1}})
		if a["X"] != 300 {
			t.Errorf("X %d, want the whole 300 (the old state dropped)", a["X"])
		}
	})
}

// TestBreakdownRestart restarts statsd between samples, with and without a
// container that exited before: no container's counter nor the own share
// goes down, and containers + exited + own stay the cgroup's CPU.
func TestBreakdownRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		exited bool
	}{{"live only", false}, {"an exited container", true}} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			b := &breakdown{own: newOwnTracker(t.TempDir())}
			raw := map[string]uint64{"a": 0, "b": 0, "c": 0}
			var cgroup, procs uint64
			last := map[string]uint64{}
			var lastOwn, exitedCPU uint64
			for i := range 60 {
				for id := range raw {
					raw[id] += uint64(rng.IntN(5e6))
				}
				cgroup += 3000 + uint64(rng.IntN(15000))
				procs += uint64(rng.IntN(300))
				if tc.exited && i == 20 {
					exitedCPU = last["c"] // identity keeps it
					delete(raw, "c")
				}
				if i%15 == 14 {
					b = restarted(t, b)
				}
				got, own := podSample(b, cgroup, procs, raw)
				var sum uint64
				for id, v := range got {
					if v < last[id] {
						t.Fatalf("sample %d: %s went down %d -> %d", i, id, last[id], v)
					}
					last[id] = v
					sum += v
				}
				if own < lastOwn {
					t.Fatalf("sample %d: own went down %d -> %d", i, lastOwn, own)
				}
				lastOwn = own
				// The floor of each container's part is what is not split.
				if total := sum + exitedCPU + own; total > cgroup || cgroup-total > 3 {
					t.Fatalf("sample %d: containers %d + exited %d + own %d = %d, cgroup %d", i, sum, exitedCPU, own, total, cgroup)
				}
			}
		})
	}
}

// TestBreakdownRestartDrift bounds what a crash between saves can cost: the
// state restored is the one saved some samples before the crash, and the
// first sample after splits that whole window at once. A container's
// figure then is at most its increase over the window times the relative
// spread of the cgroup/sentry scale (the application usec per sentry ns)
// within it below the one served before the crash (plus a usec of floor per
// sample).
func TestBreakdownRestartDrift(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var worst float64
	for trial := range 200 {
		b := &breakdown{own: newOwnTracker(t.TempDir())}
		raw := map[string]uint64{"a": 0, "b": 0}
		var cgroup uint64
		jitter := 0.02 + 0.2*rng.Float64() // the scale's spread
		step := func() {
			var d uint64
			for id := range raw {
				x := uint64(rng.IntN(4e6))
				if rng.IntN(3) == 0 {
					x = 0 // idle now and then: the proportions move
				}
				raw[id] += x
				d += x
			}
			cgroup += uint64(float64(d) / 1000 * (1 + jitter*rng.Float64()))
		}
		for range 5 {
			step()
			podSample(b, cgroup, 0, raw)
		}
		saved, _ := (&cgroupSource{bd: b}).BreakdownState()
		before, _ := podSample(b, cgroup, 0, raw)
		window := 3 + rng.IntN(8)
		var served map[string]uint64
		for range window {
			step()
			served, _ = podSample(b, cgroup, 0, raw)
		}
		nb := &breakdown{own: newOwnTracker(t.TempDir())}
		if err := (&cgroupSource{bd: nb}).RestoreBreakdownState(saved); err != nil {
			t.Fatal(err)
		}
		step()
		after, _ := podSample(nb, cgroup, 0, raw)
		for id, v := range served {
			inc := v - before[id]
			bound := uint64(jitter*float64(inc)) + uint64(window) + 1
			if v > after[id] {
				drop := v - after[id]
				if drop > bound {
					t.Errorf("trial %d: %s served %d, %d after the restart: %d down, bound %d (window +%d, spread %.0f%%)", trial, id, v, after[id], drop, bound, inc, jitter*100)
				}
				if inc > 0 {
					worst = max(worst, float64(drop)/float64(inc))
				}
			}
		}
	}
	t.Logf("worst drop: %.2f%% of the container's increase over the window (scale spread up to 22%%)", worst*100)
}

// TestBreakdownStateRefused: a persisted state that does not decode, is
// over a cap or contradicts itself is refused, and the breakdown starts
// afresh.
func TestBreakdownStateRefused(t *testing.T) {
	ok := breakdownState{Version: 1, SandboxID: "sbx", Split: 100, Containers: []containerState{{ID: "a", Raw: 5, Attr: 60}}}
	enc := func(f func(*breakdownState)) []byte {
		st := ok
		st.Containers = append([]containerState(nil), ok.Containers...)
		f(&st)
		b, _ := json.Marshal(st)
		return b
	}
	var many []containerState
	for i := range maxStateContainers + 1 {
		many = append(many, containerState{ID: fmt.Sprintf("c%d", i)})
	}
	var procs []procState
	for i := range maxStateProcs + 1 {
		procs = append(procs, procState{PID: i + 1})
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"not JSON", []byte("{")},
		{"unknown field", []byte(`{"v":1,"sandbox_id":"sbx","x":1}`)},
		{"over the byte cap", []byte(`{"v":1,"sandbox_id":"` + strings.Repeat("s", source.MaxBreakdownStateBytes) + `"}`)},
		{"another version", enc(func(s *breakdownState) { s.Version = 2 })},
		{"no sandbox id", enc(func(s *breakdownState) { s.SandboxID = "" })},
		{"too many containers", enc(func(s *breakdownState) { s.Containers = many })},
		{"too many processes", enc(func(s *breakdownState) { s.Procs = procs })},
		{"more attributed than split", enc(func(s *breakdownState) { s.Split = 10 })},
		{"a repeated container", enc(func(s *breakdownState) { s.Containers = append(s.Containers, s.Containers[0]) })},
		{"a bad pid", enc(func(s *breakdownState) { s.Procs = []procState{{PID: 0}} })},
		{"done in µs not its ticks", enc(func(s *breakdownState) { s.DoneTicks, s.DoneUsec = 3, 40_000 })},
		{"a process's µs not its ticks", enc(func(s *breakdownState) { s.Procs = []procState{{PID: 1, Ticks: 2, Usec: 19_999}} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &breakdown{own: newOwnTracker(t.TempDir())}
			err := (&cgroupSource{bd: b}).RestoreBreakdownState(tc.in)
			if !errors.Is(err, ErrBreakdownState) {
				t.Fatalf("err %v, want ErrBreakdownState", err)
			}
			fresh, _ := podSample(&breakdown{own: newOwnTracker(t.TempDir())}, 300, 0, map[string]uint64{"a": 1e9})
			if got, _ := podSample(b, 300, 0, map[string]uint64{"a": 1e9}); got["a"] != fresh["a"] {
				t.Errorf("a %d, want %d: not started afresh", got["a"], fresh["a"])
			}
		})
	}
	if _, err := decodeBreakdownState(enc(func(*breakdownState) {})); err != nil {
		t.Errorf("a good state refused: %v", err)
	}
}

// TestOwnTrackerRestored: the done ticks and the checked processes come
// back; a process gone since keeps its figure, one whose pid another
// process holds now too; a state of another sandbox is dropped.
func TestOwnTrackerRestored(t *testing.T) {
	const root = "/run/runsc"
	p := newFakeProc(t)
	p.set(10, 'S', 100, 1000, sentryArgs(root), sbxCgroup)
	p.set(11, 'S', 30, 1001, goferArgs(root), sbxCgroup)
	p.set(12, 'S', 20, 1002, goferArgs(root), sbxCgroup)
	o := newOwnTracker(p.dir)
	if _, err := o.read(root, 10, []int{11, 12}); err != nil {
		t.Fatal(err)
	}
	p.exit(12) // gone before the restart: in done
	if _, err := o.read(root, 10, []int{11}); err != nil {
		t.Fatal(err)
	}
	var st breakdownState
	o.exportState(&st)
	p.exit(11)                                            // gone while statsd was down
	p.set(10, 'S', 50, 2000, []string{"sh"}, "0::/other") // the sentry's pid reused
	n := newOwnTracker(p.dir)
	n.restoreState(st)
	r, err := n.read(root, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(150 * 10000); r.Usec != want {
		t.Errorf("own %d usec after the restart, want %d (every process's last figure)", r.Usec, want)
	}
	b := &breakdown{own: n}
	b.dropRestored()
	if r, _ := n.read(root, 10, nil); r.Usec != 0 {
		t.Errorf("own %d usec after dropping another sandbox's state, want 0", r.Usec)
	}
}

// TestOwnTrackerRestoredUsec: the own processes' CPU persisted in µs
// comes back to the µs (the processes gone while statsd was down keep
// their figures exactly); an older statsd's state, in ticks alone, still
// restores, each figure its ticks.
func TestOwnTrackerRestoredUsec(t *testing.T) {
	const root = "/run/runsc"
	for _, tc := range []struct {
		name  string
		state string
		want  uint64
		// again: saved and restored once more; the µs are not written yet
		// (writeOwnUsec), so the ticks' figure.
		again uint64
	}{
		{"ticks alone (an older statsd's)", `{"v":1,"sandbox_id":"sbx","own_usec":0,"split_usec":0,"done_ticks":3,"procs":[{"pid":11,"start":1001,"ticks":2}]}`, 50_000, 50_000},
		{"µs beside the ticks", `{"v":1,"sandbox_id":"sbx","own_usec":0,"split_usec":0,"done_ticks":3,"done_usec":34567,"procs":[{"pid":11,"start":1001,"ticks":2,"usec":25678}]}`, 60_245, 50_000},
		{"µs under a tick", `{"v":1,"sandbox_id":"sbx","own_usec":0,"split_usec":0,"done_usec":9999,"procs":[{"pid":11,"start":1001,"ticks":0,"usec":1}]}`, 10_000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeProc(t) // every process gone: each keeps its restored figure
			b := &breakdown{own: newOwnTracker(p.dir)}
			if err := (&cgroupSource{bd: b}).RestoreBreakdownState([]byte(tc.state)); err != nil {
				t.Fatal(err)
			}
			var st breakdownState
			b.own.exportState(&st)
			st.Version, st.SandboxID = breakdownStateVersion, "sbx"
			enc, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if (bytes.Contains(enc, []byte(`"done_usec"`)) || bytes.Contains(enc, []byte(`,"usec"`))) && !writeOwnUsec {
				t.Errorf("saved %s: µs written before every statsd a rollback may go to reads them", enc)
			}
			again := &breakdown{own: newOwnTracker(p.dir)}
			if err := (&cgroupSource{bd: again}).RestoreBreakdownState(enc); err != nil {
				t.Fatalf("%s: %v", enc, err)
			}
			for _, c := range []struct {
				o    *ownTracker
				want uint64
			}{{b.own, tc.want}, {again.own, tc.again}} {
				if r, err := c.o.read(root, 10, nil); err != nil || r.Usec != c.want || r.Counts != 0 {
					t.Errorf("own %+v, %v after the restart, want %d µs (state %s)", r, err, c.want, enc)
				}
			}
		})
	}
}

// TestOwnShareKeptWhenPauseUnread is the review's proof: the pause
// container's state file unread for a sample (not listed, or listed as
// unread) keeps its part in the own share, which never goes down; an
// application container whose file does not read is unread, not gone.
func TestOwnShareKeptWhenPauseUnread(t *testing.T) {
	pause := runscState{ID: "sbx", SandboxID: "sbx", Type: "sandbox"}
	app := runscState{ID: "app", SandboxID: "sbx", Type: "container", Name: "app"}
	bad := errors.New("unexpected end of JSON input")
	for _, tc := range []struct {
		name   string
		second runscSandbox
	}{
		{"pause not listed", runscSandbox{ID: "sbx", Containers: []runscState{app}}},
		{"pause unread", runscSandbox{ID: "sbx", Containers: []runscState{app}, Unread: []unreadState{{ID: "sbx", Err: bad}}}},
		{"pause unread from the start", runscSandbox{ID: "sbx", Containers: []runscState{app}, Unread: []unreadState{{ID: "sbx", Err: bad}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &breakdown{}
			sample := func(cg uint64, sb runscSandbox) source.Reading {
				r := source.Reading{CPUUsageUsec: &cg}
				b.addContainers(&r, containerRead{sb: sb,
					usage: sentryusage.Usage{CPU: map[string]uint64{"sbx": 1_000_000_000 + cg*100, "app": 1_000_000_000 + cg*1000}}, own: ownRead{Usec: 1000}}, nil)
				return r
			}
			first := runscSandbox{ID: "sbx", Containers: []runscState{pause, app}}
			if tc.name == "pause unread from the start" {
				first = tc.second
			}
			o1 := *sample(1_000_000, first).SandboxOwnCPUUsec
			r := sample(1_100_000, tc.second)
			o2 := *r.SandboxOwnCPUUsec
			o3 := *sample(1_200_000, first).SandboxOwnCPUUsec
			t.Logf("own share %d, %d, %d", o1, o2, o3)
			if o2 < o1 || o3 < o2 || o2 <= 1000 {
				t.Errorf("sandbox_own_cpu_usec %d -> %d -> %d: down, or without the pause's part", o1, o2, o3)
			}
			if len(r.UnreadContainers) != 0 {
				t.Errorf("the pause container reported unread: %v", r.UnreadContainers)
			}
		})
	}
	t.Run("an application container unread", func(t *testing.T) {
		b := &breakdown{}
		cg := uint64(1000)
		r := source.Reading{CPUUsageUsec: &cg}
		b.addContainers(&r, containerRead{sb: runscSandbox{ID: "sbx", Containers: []runscState{pause}, Unread: []unreadState{{ID: "app\x1b", Err: bad}}},
			usage: sentryusage.Usage{CPU: map[string]uint64{"app\x1b": 5}}}, nil)
		if len(r.UnreadContainers) != 1 || r.UnreadContainers[0].ID != `app\x1b` || !strings.Contains(r.UnreadContainers[0].Reason, "unexpected end") {
			t.Errorf("unread %+v, want app (escaped) with the reason", r.UnreadContainers)
		}
	})
}

// TestFindSandboxUnread: a sandbox's state file that is there but does not
// parse is listed unread, with its container id.
func TestFindSandboxUnread(t *testing.T) {
	root := getRunscRoot(t, nil)
	if err := os.WriteFile(filepath.Join(root, "gvx-busy_sandbox:gvx-sbx.state"), []byte(`{"id":`), 0o640); err != nil {
		t.Fatal(err)
	}
	sb, ok, err := newStateCache().findSandbox([]string{root}, "gvx-sbx", 0, "")
	if !ok || err != nil {
		t.Fatalf("ok %v, err %v", ok, err)
	}
	if len(sb.Unread) != 1 || sb.Unread[0].ID != "gvx-busy" || !errors.Is(sb.Unread[0].Err, ErrRunscState) {
		t.Errorf("unread %+v, want gvx-busy with ErrRunscState", sb.Unread)
	}
}

// TestOwnSentryOtherRoot is the review's proof: a sentry started with
// --root=/run/runsc, found in a state file of statsd's --runsc-root
// /host/run/runsc (a hostPath mount), counts when its cgroups name the
// bound cgroup, or it is the pinned sentry, or the roots are one directory
// here; otherwise the own share says why it is absent.
func TestOwnSentryOtherRoot(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "run-runsc")
	link := filepath.Join(dir, "var-run-runsc")
	os.Mkdir(real, 0o755)
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, argRoot, root, cgroup string
		pinned                      bool
		wantOK                      bool
	}{
		{"its cgroup names the bound one", "/run/runsc", "/host/run/runsc", "/sandbox", false, true},
		{"pinned", "/run/runsc", "/host/run/runsc", "", true, true},
		{"the same directory by a symlink", real, link, "", false, true},
		{"not verified", "/run/runsc", "/host/run/runsc", "/elsewhere", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeProc(t)
			p.set(10, 'S', 800, 1000, sentryArgs(tc.argRoot, "--platform=kvm"), sbxCgroup)
			p.set(11, 'S', 3, 1001, goferArgs(tc.argRoot), sbxCgroup)
			o := newOwnTracker(p.dir)
			o.cgroup = tc.cgroup
			if tc.pinned {
				o.pinned = func() (int, uint64, bool) { return 10, 1000, true }
			}
			r, err := o.read(tc.root, 10, []int{11})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", r)
			switch {
			case tc.wantOK && (r.Usec != 803*10000 || !r.KVM || r.SentryWhy != ""):
				t.Errorf("own %d usec, kvm %v, why %q; want %d, true", r.Usec, r.KVM, r.SentryWhy, 803*10000)
			case !tc.wantOK && (r.SentryWhy == "" || !strings.Contains(r.SentryWhy, "--root")):
				t.Errorf("why %q, want the sentry's --root named", r.SentryWhy)
			}
		})
	}
	t.Run("own absent with the reason", func(t *testing.T) {
		b := &breakdown{}
		cg := uint64(1000)
		r := source.Reading{CPUUsageUsec: &cg}
		b.addContainers(&r, containerRead{sb: runscSandbox{ID: "sbx", Containers: []runscState{{ID: "sbx", SandboxID: "sbx", Type: "sandbox"}}},
			own: ownRead{Usec: 30, SentryWhy: "the sentry (pid 10) runs with --root=x"}}, nil)
		if r.SandboxOwnCPUUsec != nil || !hasAbsent(r.Absent, "sandbox_own_cpu_usec", "--root=x") {
			t.Errorf("own %v, absent %v", r.SandboxOwnCPUUsec, r.Absent)
		}
	})
}

// TestOwnPidReuseZombieCountedOnce is the review's proof of finding 4
// (fixed on main): a gofer's pid reused by a zombie counts its ticks once.
func TestOwnPidReuseZombieCountedOnce(t *testing.T) {
	const root = "/run/runsc"
	p := newFakeProc(t)
	p.set(10, 'S', 8, 1000, sentryArgs(root), sbxCgroup)
	p.set(11, 'S', 300, 1001, goferArgs(root), sbxCgroup)
	o := newOwnTracker(p.dir)
	if _, err := o.read(root, 10, []int{11}); err != nil {
		t.Fatal(err)
	}
	p.set(11, 'Z', 0, 5000, []string{"sh"}, "0::/other\n")
	for i := range 3 {
		r, err := o.read(root, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(308 * 10000); r.Usec != want {
			t.Errorf("sample %d: own %d usec, want %d (the gofer's 300 ticks once)", i, r.Usec, want)
		}
	}
}

package server

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// manualClock is a clock that moves only when told, shared by the store
// (epochs, ends) and the read side (observed times).
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// gvisorFixture is a copy of gvisor's cgroup v2 fixture tree that a test may
// change, with a harness whose every binding opens a real gVisor source on
// its /sandbox cgroup (reads bounded by readTimeout), and the harness clock.
type gvisorFixture struct {
	root string // the cgroup mount; the sandbox cgroup is root/sandbox
	h    *harness
	clk  *manualClock
	ref  *sandboxstatsv1.SandboxRef
}

func newGVisorFixture(t *testing.T, readTimeout time.Duration) *gvisorFixture {
	t.Helper()
	f := &gvisorFixture{root: t.TempDir(), clk: &manualClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)},
		ref: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/sandbox"}}
	if err := os.CopyFS(f.root, os.DirFS(filepath.Join("..", "gvisor", "testdata", "cgroup", "v2"))); err != nil {
		t.Fatal(err)
	}
	f.h = newHarness(t, func(c *identity.Config) { c.Now, c.ReadTimeout = f.clk.now, readTimeout })
	f.h.stats.now = f.clk.now // before any call: the server reads it only in a handler
	f.h.open = func() source.Source {
		s, err := gvisor.Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
			gvisor.Config{CgroupRoot: f.root, Mode: gvisor.ModeUnified, ReadTimeout: readTimeout})
		if err != nil {
			t.Errorf("gvisor.Open: %v", err)
			return nil
		}
		return s
	}
	return f
}

var usageRE = regexp.MustCompile(`(?m)^usage_usec (\d+)$`)

// usage returns the sandbox cgroup's cpu.stat usage_usec.
func (f *gvisorFixture) usage(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.root, "sandbox", "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	m := usageRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("no usage_usec in cpu.stat:\n%s", b)
	}
	v, err := strconv.ParseUint(string(m[1]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// setUsage rewrites the sandbox cgroup's cpu.stat usage_usec, the rest kept.
func (f *gvisorFixture) setUsage(t *testing.T, usec uint64) {
	t.Helper()
	p := filepath.Join(f.root, "sandbox", "cpu.stat")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b = usageRE.ReplaceAll(b, []byte("usage_usec "+strconv.FormatUint(usec, 10)))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *gvisorFixture) poll(t *testing.T) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	t.Helper()
	resp, err := f.h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatalf("StatsActiveWorkloads: %v", err)
	}
	return resp
}

// TestGVisorV2ChargedExactly: a real gVisor source on a v2 fixture tree,
// bound in the store and polled over the wire as the node agent polls it,
// its cpu.stat usage_usec changed between the polls and before the
// Checkpoint: the node agent's accountant charges the head from the epoch
// start (the first sample's whole counter), the growth between samples and
// the tail from the ended record's final, which add up to the cgroup's
// counter at the end exactly, once however often the record is served; an
// agent that never sampled the activation charges the same from its record.
func TestGVisorV2ChargedExactly(t *testing.T) {
	f := newGVisorFixture(t, 2*time.Second)
	acct := rate.NewAccountant(rate.AccountantConfig{Started: f.clk.now().Add(-time.Minute), CPUs: 2, Horizon: time.Hour, HeadSlack: rate.DefaultHeadSlack})
	epoch := f.h.run(t, identA, f.ref)
	if epoch != f.clk.now().UnixNano() {
		t.Fatalf("epoch %d, want the clock's %d", epoch, f.clk.now().UnixNano())
	}
	var charged []uint64
	for i, next := range []uint64{0, 1_255_682, 1_700_000} { // 0: the fixture's own 255682 at the first poll
		if next != 0 {
			f.setUsage(t, next)
		}
		f.clk.advance(2 * time.Second)
		resp := f.poll(t)
		if len(resp.GetSamples()) != 1 {
			t.Fatalf("poll %d: %v", i, resp)
		}
		s := resp.GetSamples()[0]
		if s.GetCpuUsageUsec() != f.usage(t) || s.GetEpochBaseline().GetKind() != sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START ||
			s.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP {
			t.Fatalf("poll %d: sample %v, want cpu.stat's usage_usec %d from the epoch start", i, s, f.usage(t))
		}
		cs, ev := acct.Sample(s, f.clk.now())
		want := rate.EventNone
		if i == 0 {
			want = rate.EventFirst
		}
		if ev != want {
			t.Errorf("poll %d: event %q, want %q", i, ev, want)
		}
		charged = append(charged, cs.CPU())
	}
	if charged[0] != 255_682 {
		t.Errorf("head charged %d us, want the fixture's whole 255682 (from the epoch start)", charged[0])
	}

	f.setUsage(t, 2_000_000)
	f.clk.advance(time.Second)
	resp, err := f.h.lifecycle.CheckpointWorkload(context.Background(), &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	e := resp.GetEnded()
	if e.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END || e.GetCpuUsec() != 2_000_000 ||
		e.GetMemoryPeakBytes() != 301989888 || e.GetMemoryPeakIsLowerBound() || e.GetEndUnixNano() != f.clk.now().UnixNano() {
		t.Fatalf("ended = %v; want read at the end, 2000000 us, memory.peak's 301989888", e)
	}
	served := f.poll(t).GetEnded()
	if len(served) != 1 {
		t.Fatalf("served %d records", len(served))
	}
	for i := range 3 { // served in three sweeps: charged once
		cs, how, first := acct.End(served[0], f.clk.now().Add(time.Duration(i)*time.Minute))
		if i == 0 {
			if !first || how != rate.EndTail {
				t.Fatalf("End: %q, first %v; want the tail", how, first)
			}
			charged = append(charged, cs.CPU())
		} else if first || cs.CPU() != 0 {
			t.Errorf("record served again charged %d us (first %v)", cs.CPU(), first)
		}
	}
	var sum uint64
	for _, c := range charged {
		sum += c
	}
	t.Logf("charged head %d, body %d and %d, tail %d us: %d us; cpu.stat usage_usec %d", charged[0], charged[1], charged[2], charged[3], sum, f.usage(t))
	if sum != f.usage(t) || charged[3] != 300_000 {
		t.Errorf("charged %v = %d us, want cpu.stat's %d (tail 300000)", charged, sum, f.usage(t))
	}

	unseen := rate.NewAccountant(rate.AccountantConfig{Started: f.clk.now().Add(-time.Minute), CPUs: 2, Horizon: time.Hour, HeadSlack: rate.DefaultHeadSlack})
	if cs, how, _ := unseen.End(served[0], f.clk.now()); how != rate.EndWhole || cs.CPU() != f.usage(t) {
		t.Errorf("an agent that never sampled it charged %d us (%q), want the whole %d", cs.CPU(), how, f.usage(t))
	}
}

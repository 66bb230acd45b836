package drift

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// One SystemObserver is shared by every binding the Checker checks in turn:
// what it remembers of an epoch (sentry cgroup, OOM base, the agent's last
// answer, the VMM pin) is each actor's own, so checking a second binding
// never hides the first's drift nor lends it the first's baselines. Each
// test failed while that state was one per observer.
func TestObserverSeveralBindingsSentryMoved(t *testing.T) {
	proc := procTree(t, map[int]string{77: "runsc-sandbox\x00", 88: "runsc-sandbox\x00"})
	o := NewSystemObserver(proc, time.Second, time.Minute, nil)
	a := &identity.Binding{Identity: identity.Identity{ActorUID: "a"}, Ref: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 77}, EpochUnixNano: 1, Source: stubSource{r: source.Reading{SandboxProcesses: u32(2)}}}
	b := &identity.Binding{Identity: identity.Identity{ActorUID: "b"}, Ref: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 88}, EpochUnixNano: 2, Source: stubSource{r: source.Reading{SandboxProcesses: u32(2)}}}
	ctx := context.Background()
	o.Observe(ctx, a)
	o.Observe(ctx, b)
	os.WriteFile(filepath.Join(proc, "77", "cgroup"), []byte("4:memory:/elsewhere\n0::/\n"), 0o644)
	if got := summary(o.Observe(ctx, a)); len(got) != 1 {
		t.Errorf("a's sentry moved, with b checked in between: findings %v, want SENTRY_MOVED pid 77", got)
	}
}

func TestObserverSeveralBindingsOOM(t *testing.T) {
	o := NewSystemObserver(t.TempDir(), time.Second, time.Minute, nil)
	ctx := context.Background()
	mk := func(actor string, epoch int64, procs uint32, kills uint64) *identity.Binding {
		return &identity.Binding{Identity: identity.Identity{ActorUID: actor}, Ref: source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/" + actor}, EpochUnixNano: epoch,
			Source: stubSource{r: source.Reading{SandboxProcesses: u32(procs), Memory: &source.MemorySignals{OOMKills: u64(kills)}}}}
	}
	o.Observe(ctx, mk("a", 1, 3, 0))
	o.Observe(ctx, mk("b", 2, 3, 0))
	got := summary(o.Observe(ctx, mk("a", 1, 0, 1)))
	if len(got) != 1 || got[0] != "OOM_KILLED /a" {
		t.Errorf("a OOM-killed, b checked in between: %v, want OOM_KILLED /a", got)
	}
	// The same epoch for two actors: b's first look is its own baseline,
	// never a's.
	o2 := NewSystemObserver(t.TempDir(), time.Second, time.Minute, nil)
	o2.Observe(ctx, mk("a", 5, 3, 0))
	if got = summary(o2.Observe(ctx, mk("b", 5, 0, 7))); len(got) != 1 || got[0] != "SANDBOX_DEAD /b" {
		t.Errorf("b dead at its first look with 7 kills, a of the same epoch seen with 0: %v, want SANDBOX_DEAD /b", got)
	}
}

func TestObserverSeveralBindingsAgentSilent(t *testing.T) {
	clock := time.Unix(1_800_000_000, 0)
	o := NewSystemObserver(t.TempDir(), time.Second, 15*time.Minute, func() time.Time { return clock })
	ctx := context.Background()
	epoch := clock.Add(-time.Hour).UnixNano()
	a := &identity.Binding{Identity: identity.Identity{ActorUID: "a"}, Ref: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1024", ContainerIDs: []string{"c"}}, EpochUnixNano: epoch, Source: stubSource{r: source.Reading{}}}
	b := &identity.Binding{Identity: identity.Identity{ActorUID: "b"}, Ref: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://4:1024", ContainerIDs: []string{"c"}}, EpochUnixNano: epoch + 1, Source: stubSource{r: source.Reading{}}}
	o.Observe(ctx, a) // a's agent answers now
	o.Observe(ctx, b)
	clock = clock.Add(time.Minute)
	a.Source = stubSource{err: source.ErrTimeout}
	if got := summary(o.Observe(ctx, a)); slices.ContainsFunc(got, func(f string) bool { return strings.HasPrefix(f, "AGENT_SILENT") }) {
		t.Errorf("a's agent answered a minute ago (grace 15m), one timeout: %v, want no AGENT_SILENT", got)
	}
}

package drift

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestKindDead: the kinds that say the sandbox is dead, and only those.
func TestKindDead(t *testing.T) {
	var got []string
	for k := KindUnspecified; int(k) < len(kindNames); k++ {
		if k.Dead() {
			got = append(got, k.String())
		}
	}
	want := []string{"CGROUP_GONE", "SANDBOX_DEAD", "SENTRY_GONE", "VMM_GONE", "OOM_KILLED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead kinds (-want +got):\n%s", diff)
	}
}

// TestSeenDead: an open finding of the actor's epoch saying its sandbox is
// dead, first seen by the time asked, is found; the earliest wins.
func TestSeenDead(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	finding := func(k Kind, actor string, epoch int64, at time.Duration) Finding {
		return Finding{Kind: k, Subject: "/statstest", ActorUID: actor, Epoch: epoch, FirstSeen: t0.Add(at), Detail: k.String()}
	}
	for _, tc := range []struct {
		name string
		open []Finding
		by   time.Duration
		want *Finding
	}{
		{name: "none open", by: time.Hour},
		{name: "dead before", open: []Finding{finding(KindSandboxDead, "a", 7, 0)}, by: time.Minute,
			want: new(finding(KindSandboxDead, "a", 7, 0))},
		{name: "dead at the very time", open: []Finding{finding(KindCgroupGone, "a", 7, time.Minute)}, by: time.Minute,
			want: new(finding(KindCgroupGone, "a", 7, time.Minute))},
		{name: "dead only after", open: []Finding{finding(KindSandboxDead, "a", 7, 2*time.Minute)}, by: time.Minute},
		{name: "another actor's", open: []Finding{finding(KindSandboxDead, "b", 7, 0)}, by: time.Minute},
		{name: "an earlier epoch's", open: []Finding{finding(KindSandboxDead, "a", 6, 0)}, by: time.Minute},
		{name: "not a death", open: []Finding{finding(KindAgentSilent, "a", 7, 0), finding(KindStrayVMM, "a", 7, 0), finding(KindSentryMoved, "a", 7, 0)}, by: time.Minute},
		{name: "the earliest of several", by: time.Hour,
			open: []Finding{finding(KindSentryGone, "a", 7, 2*time.Minute), finding(KindOOMKilled, "a", 7, time.Minute), finding(KindAgentSilent, "a", 7, 0)},
			want: new(finding(KindOOMKilled, "a", 7, time.Minute))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.open {
				c.open[f.key()] = f
			}
			got, ok := c.SeenDead("a", 7, t0.Add(tc.by))
			var gotp *Finding
			if ok {
				gotp = &got
			}
			if diff := cmp.Diff(tc.want, gotp); diff != "" {
				t.Errorf("SeenDead (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSeenDeadAfterACycle: a finding a cycle opened is what SeenDead
// reports for the bound activation, from the cycle's time on.
func TestSeenDeadAfterACycle(t *testing.T) {
	f := newFixture(t, "", obs(all, nil, dead))
	epoch := f.store.Bound("actor-a").EpochUnixNano
	at := f.clock.now()
	if _, ok := f.checker.SeenDead("actor-a", epoch, at); ok {
		t.Fatal("seen dead before any cycle")
	}
	f.checker.Cycle(context.Background())
	got, ok := f.checker.SeenDead("actor-a", epoch, at)
	if !ok {
		t.Fatalf("not seen dead after a cycle found it; open: %v", f.checker.Open())
	}
	if diff := cmp.Diff([]any{KindSandboxDead, at}, []any{got.Kind, got.FirstSeen}); diff != "" {
		t.Errorf("finding (-want +got):\n%s", diff)
	}
	if _, ok := f.checker.SeenDead("actor-a", epoch, at.Add(-time.Nanosecond)); ok {
		t.Error("seen dead before the cycle that found it")
	}
}

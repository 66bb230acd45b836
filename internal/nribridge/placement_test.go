package nribridge

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// tenantPod is a running runsc pod of namespace ns with uid, numbered i
// (its sandbox and sentry pid its own).
func tenantPod(ns, uid string, i int) *api.PodSandbox {
	p := testPod(i)
	p.Namespace, p.Uid, p.Name = ns, uid, fmt.Sprintf("%s-%d", ns, i)
	return p
}

// firstChoice is the statsd the bridge tries first for uid: what an
// attacker who knows the placement crafts uids for.
func firstChoice(b *testBridge, uid string) int { return b.Bridge.firstChoice(uid) }

// craftUIDs makes n uids with prefix whose first choice is shard.
func craftUIDs(b *testBridge, prefix string, shard, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if uid := fmt.Sprintf("%s-%05d", prefix, i); firstChoice(b, uid) == shard {
			out = append(out, uid)
		}
	}
	return out
}

// TestShardAttack: a tenant that knows the placement crafts pod uids that
// all go to one statsd first, and keeps them: that statsd takes at most
// the namespace's cap of them, the rest spill to their next choices; the
// other tenants' pods whose first choice is that statsd are all bound
// (those it has no room for spill), each once, none left unmeasured.
func TestShardAttack(t *testing.T) {
	const shards, perShard, nsCap = 4, 8, 4
	fs := fakes(t, shards)
	for _, f := range fs {
		f.SetMaxWorkloads(perShard)
	}
	b := startBridge(t, fs, func(o *Options) { o.NamespaceCap = nsCap })
	b.Synchronize(nil, nil) // connected: every statsd listed

	n := 0
	var want []string
	attacker := craftUIDs(b, "evil", 0, 12)
	for _, uid := range attacker {
		n++
		b.RunPodSandbox(tenantPod("evil", uid, n))
		want = append(want, uid)
	}
	if !within(5*time.Second, func() bool { return slices.Equal(allBound(fs), sorted(want)) }) {
		t.Errorf("the attacker's pods: %d of %d bound (%s)", len(allBound(fs)), len(want), holding(fs))
	}

	// Three other tenants, two pods each, all placed on statsd 0 first.
	for _, ns := range []string{"shop", "blog", "mail"} {
		for _, uid := range craftUIDs(b, ns, 0, 2) {
			n++
			b.RunPodSandbox(tenantPod(ns, uid, n))
			want = append(want, uid)
		}
	}
	if !within(5*time.Second, func() bool { return slices.Equal(allBound(fs), sorted(want)) }) {
		var left []string
		for _, uid := range want[len(attacker):] {
			if !slices.Contains(allBound(fs), uid) {
				left = append(left, uid)
			}
		}
		t.Errorf("the other tenants' pods: %d of %d left unmeasured %v (%s; TOO_MANY_WORKLOADS refusals %d)",
			len(left), len(want)-len(attacker), left, holding(fs), refusals(fs))
	}
	if got := allBound(fs); len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("a pod bound on two statsd: %v", got)
	}

	evilOn0 := 0
	for uid := range fs[0].Bound() {
		if strings.HasPrefix(uid, "evil-") {
			evilOn0++
		}
	}
	if evilOn0 > nsCap {
		t.Errorf("statsd 0 holds %d of the attacker's pods, the namespace cap is %d", evilOn0, nsCap)
	}
	if n := testutil.ToFloat64(b.m.spilled.WithLabelValues("statsd-full")); n < 1 {
		t.Errorf("no pod spilled from a full statsd (%v)", n)
	}
	if n := testutil.ToFloat64(b.m.spilled.WithLabelValues("namespace-cap")); n < float64(len(attacker)-nsCap) {
		t.Errorf("%v pods spilled for the namespace cap, want at least %d", n, len(attacker)-nsCap)
	}
	t.Logf("%s; TOO_MANY_WORKLOADS refusals %d; spills %v for the namespace cap, %v from a full statsd", holding(fs), refusals(fs),
		testutil.ToFloat64(b.m.spilled.WithLabelValues("namespace-cap")), testutil.ToFloat64(b.m.spilled.WithLabelValues("statsd-full")))
}

// within polls cond every 5ms for up to d.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// holding says how many each fake holds, and of which namespaces.
func holding(fs []*statsdfake.Lifecycle) string {
	var out []string
	for i, f := range fs {
		by := map[string]int{}
		for _, r := range f.Bound() {
			by[r.GetIdentity().GetActorNamespace()]++
		}
		out = append(out, fmt.Sprintf("statsd %d: %d %v", i, len(f.Bound()), by))
	}
	return strings.Join(out, "; ")
}

// refusals counts the fakes' TOO_MANY_WORKLOADS refusals.
func refusals(fs []*statsdfake.Lifecycle) int {
	n := 0
	for _, f := range fs {
		for _, e := range f.Events() {
			if strings.HasSuffix(e, " TOO_MANY_WORKLOADS") {
				n++
			}
		}
	}
	return n
}

// allBound is every uid the fakes hold, sorted, each as often as held.
func allBound(fs []*statsdfake.Lifecycle) []string {
	var out []string
	for _, f := range fs {
		out = append(out, boundUIDs(f)...)
	}
	return sorted(out)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRestartFindsSpilledPods: a pod spilled from its full first choice
// stays where it is bound across a restart of the bridge, though its
// first choice has room by then: the new bridge lists every statsd before
// it binds anything, and binds nothing twice.
func TestRestartFindsSpilledPods(t *testing.T) {
	fs := fakes(t, 2)
	for _, f := range fs {
		f.SetMaxWorkloads(1)
	}
	key := []byte("a per-node secret of 32 bytes...")
	withKey := func(o *Options) { o.PlacementKey = key }
	b1 := startBridge(t, fs, withKey)
	b1.Synchronize(nil, nil)
	uids := craftUIDs(b1, "pod", 0, 2)
	a, s := tenantPod("shop", uids[0], 1), tenantPod("shop", uids[1], 2)
	b1.RunPodSandbox(a)
	eventually(t, "a bound on its first choice", func() bool { return len(fs[0].Bound()) == 1 })
	b1.RunPodSandbox(s)
	eventually(t, "the other spilled", func() bool { _, ok := fs[1].Bound()[s.Uid]; return ok })
	b1.stop()

	for round := range 2 { // a ended meanwhile; a second restart changes nothing
		before := [][]string{fs[0].Events(), fs[1].Events()}
		b2 := startBridge(t, fs, withKey)
		b2.Synchronize([]*api.PodSandbox{s}, nil)
		eventually(t, "reconciled", func() bool {
			return len(fs[0].Bound()) == 0 && slices.Contains(fs[1].Events()[len(before[1]):], "retry "+s.Uid)
		})
		time.Sleep(100 * time.Millisecond) // anything else it would do
		b2.stop()
		var got [][]string
		for i, f := range fs {
			got = append(got, f.Events()[len(before[i]):])
		}
		want := [][]string{{"checkpoint " + a.Uid + " runtime-stopped"}, {"update " + s.Uid, "retry " + s.Uid}}
		if round == 1 {
			want[0] = []string{}
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("round %d: statsd's events after the restart (-want +got):\n%s", round, diff)
		}
	}
}

// TestPlacementKeyFile: made on first use (0600, random), the same on the
// next; refused when others may read it, when not a regular file, when
// of the wrong size.
func TestPlacementKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "statsnri", "placement.key")
	k1, err := LoadPlacementKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || len(k1) != PlacementKeySize {
		t.Fatalf("key file %v %v, %d bytes", fi.Mode(), err, len(k1))
	}
	if d, err := os.Stat(filepath.Dir(path)); err != nil || d.Mode().Perm() != 0o700 {
		t.Errorf("its directory: %v %v", d.Mode(), err)
	}
	k2, err := LoadPlacementKey(path)
	if err != nil || !slices.Equal(k1, k2) {
		t.Errorf("the second load: %x, %v; the first %x", k2, err, k1)
	}
	other, _ := LoadPlacementKey(filepath.Join(dir, "other.key"))
	if slices.Equal(k1, other) {
		t.Error("two key files hold the same key")
	}
	for _, tc := range []struct {
		name, want string
		make       func(p string) error
	}{
		{"group-readable", "mode 0640", func(p string) error { return os.WriteFile(p, k1, 0o640) }},
		{"world-readable", "mode 0604", func(p string) error { return os.WriteFile(p, k1, 0o604) }},
		{"short", "16 bytes, want 32", func(p string) error { return os.WriteFile(p, k1[:16], 0o600) }},
		{"symlink", "too many levels of symbolic links", func(p string) error { return os.Symlink(path, p) }},
		{"directory", "not a regular file", func(p string) error { return os.Mkdir(p, 0o700) }},
		{"fifo", "not a regular file", func(p string) error { return syscall.Mkfifo(p, 0o600) }},
		{"foreign-owner", "owned by uid 12345", func(p string) error {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			if err := os.WriteFile(p, k1, 0o600); err != nil {
				return err
			}
			return os.Chown(p, 12345, 12345)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := tc.make(p); err != nil {
				t.Fatal(err)
			}
			_, err := LoadPlacementKey(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("LoadPlacementKey(%s) = %v, want an error naming it and %q", tc.name, err, tc.want)
			}
		})
	}
}

// TestNamespaceAtItsCapEverywhere: a pod whose namespace holds the cap on
// every statsd is not bound (counted) until one of its namespace's pods
// ends; another namespace's pod is bound meanwhile.
func TestNamespaceAtItsCapEverywhere(t *testing.T) {
	fs := fakes(t, 2)
	b := startBridge(t, fs, func(o *Options) { o.NamespaceCap = 1 })
	pods := []*api.PodSandbox{tenantPod("evil", "evil-1", 1), tenantPod("evil", "evil-2", 2), tenantPod("evil", "evil-3", 3)}
	for _, p := range pods {
		b.RunPodSandbox(p)
	}
	b.RunPodSandbox(tenantPod("shop", "shop-1", 4))
	eventually(t, "two of the namespace's and the other's bound", func() bool { return len(allBound(fs)) == 3 })
	time.Sleep(50 * time.Millisecond)
	got := allBound(fs)
	if len(got) != 3 || !slices.Contains(got, "shop-1") {
		t.Fatalf("bound %v, want two of evil's and shop-1", got)
	}
	if n := testutil.ToFloat64(b.m.unactionable.WithLabelValues("namespace-cap")); n != 1 {
		t.Errorf("namespace-cap counted %v times, want 1", n)
	}
	var left *api.PodSandbox
	for _, p := range pods {
		if !slices.Contains(got, p.Uid) {
			left = p
		}
	}
	ended := pods[0]
	if ended == left {
		ended = pods[1]
	}
	b.StopPodSandbox(ended)
	eventually(t, "the one left out bound once its namespace's pod ended", func() bool {
		return slices.Contains(allBound(fs), left.Uid) && !slices.Contains(allBound(fs), ended.Uid)
	})
}

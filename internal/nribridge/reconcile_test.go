package nribridge

// The reconciliation's tests (split from bridge_test.go): what a
// checkpoint says, and no listing before the runtime said what runs.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// TestCheckpointSaysWhetherTheRuntimeStoppedThePod: a binding the bridge
// ends because the runtime stopped its pod (StopPodSandbox,
// RemovePodSandbox, a Synchronize listing it without a task or not at all)
// is checkpointed with runtime_stopped; one whose pod runs on (placed on
// another statsd, left out of the pods tracked) without.
func TestCheckpointSaysWhetherTheRuntimeStoppedThePod(t *testing.T) {
	req := testRequest
	without := func(i int) *api.PodSandbox { p := testPod(i); p.Pid = 0; return p }
	for _, tc := range []struct {
		name string
		// statsd: how many; maxPods: the bridge's MaxPods (0: default).
		statsd, maxPods int
		// act drives the bridge; it returns the statsd whose events count.
		act  func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle
		want []string
	}{
		{name: "stopped", statsd: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			b.RunPodSandbox(testPod(1))
			eventually(t, "bound", func() bool { return len(fs[0].Bound()) == 1 })
			b.StopPodSandbox(testPod(1))
			return fs[0]
		}, want: []string{"bind uid-001", "checkpoint uid-001 runtime-stopped"}},
		{name: "removed without a stop", statsd: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			b.RunPodSandbox(testPod(1))
			eventually(t, "bound", func() bool { return len(fs[0].Bound()) == 1 })
			b.RemovePodSandbox(testPod(1))
			return fs[0]
		}, want: []string{"bind uid-001", "checkpoint uid-001 runtime-stopped"}},
		{name: "listed without a task", statsd: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			fs[0].Preload(req(1))
			b.Synchronize([]*api.PodSandbox{without(1)}, nil)
			return fs[0]
		}, want: []string{"checkpoint uid-001 runtime-stopped"}},
		{name: "gone while the bridge was away", statsd: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			fs[0].Preload(req(1))
			b.Synchronize(nil, nil)
			return fs[0]
		}, want: []string{"checkpoint uid-001 runtime-stopped"}},
		{name: "running, bound on two statsd", statsd: 2, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			// Bound on both (a --statsd list changed): it stays on the
			// first of its order, and only there.
			i := 0
			for b.firstChoice(fmt.Sprintf("uid-%03d", i)) != 0 {
				i++
			}
			fs[0].Preload(req(i))
			fs[1].Preload(req(i))
			b.Synchronize([]*api.PodSandbox{testPod(i)}, nil)
			eventually(t, "bound where it belongs", func() bool { return len(fs[0].Bound()) == 1 })
			return fs[1]
		}, want: nil}, // filled below: "checkpoint uid-<i>"
		{name: "running, left out of the pods tracked", statsd: 1, maxPods: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			fs[0].Preload(req(1), req(2))
			b.Synchronize([]*api.PodSandbox{testPod(1), testPod(2)}, nil)
			return fs[0]
		}, want: []string{"checkpoint uid-002", "retry uid-001", "update uid-001"}},
		{name: "an older sandbox stopped, the pod left out", statsd: 1, maxPods: 1, act: func(t *testing.T, b *testBridge, fs []*statsdfake.Lifecycle) *statsdfake.Lifecycle {
			fs[0].Preload(req(1), req(2))
			renewed := testPod(2)
			renewed.Id = "sbx002-attempt1"
			b.Synchronize([]*api.PodSandbox{testPod(1), renewed}, nil)
			b.StopPodSandbox(testPod(2)) // the old sandbox: the pod runs on
			return fs[0]
		}, want: []string{"checkpoint uid-002", "retry uid-001", "update uid-001"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := fakes(t, tc.statsd)
			b := startBridge(t, fs, func(o *Options) {
				if tc.maxPods > 0 {
					o.MaxPods = tc.maxPods
				}
			})
			f := tc.act(t, b, fs)
			want := tc.want
			if want == nil {
				bound := boundUIDs(fs[0])
				want = []string{"checkpoint " + bound[0]}
			}
			eventually(t, "the checkpoint", func() bool {
				return slices.ContainsFunc(f.Events(), func(e string) bool { return strings.HasPrefix(e, "checkpoint ") })
			})
			time.Sleep(50 * time.Millisecond)
			got := f.Events()
			slices.Sort(got)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("statsd's events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNoListingBeforeSynchronize: a resync before the first Synchronize
// (NRI not there yet) lists nothing and ends nothing: which pods run is
// not known; the Synchronize then reconciles.
func TestNoListingBeforeSynchronize(t *testing.T) {
	f := fakes(t, 1)[0]
	p := testPod(1)
	f.Preload(testRequest(1))
	b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.Resync = 20 * time.Millisecond })
	time.Sleep(200 * time.Millisecond)
	if diff := cmp.Diff([]string(nil), f.Events()); diff != "" {
		t.Errorf("statsd's events before any Synchronize (-want +got):\n%s", diff)
	}
	b.Synchronize([]*api.PodSandbox{p}, nil)
	// Bound before the bridge started: its container set sent, then its
	// Run a retry.
	eventually(t, "reconciled", func() bool { return slices.Equal(f.Events(), []string{"update uid-001", "retry uid-001"}) })
}

package nribridge

import (
	"context"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxstats/sandboxstats/internal/nrifake"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// connect runs b.Connect to rt with short backoffs until the test ends,
// and waits until the bridge is connected and synchronized.
func connect(t *testing.T, b *testBridge, rt *nrifake.Runtime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Connect(ctx, ConnectOptions{Socket: rt.Socket, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "connected", func() bool { ok, _ := b.Health(); return ok })
	rt.WaitPlugins(t, 1)
}

// TestReconnectAfterRuntimeRestart: containerd restarting closes the
// connection; the bridge reconnects with backoff, and the new
// connection's Synchronize binds the pods started and ends those gone
// while it was down.
func TestReconnectAfterRuntimeRestart(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	dir := shortDir(t)
	rt := nrifake.Start(t, dir, testPod(1), testPod(2))
	connect(t, b, rt)
	eventually(t, "synchronized pods bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 2)) })
	ctx := context.Background()
	if err := rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: testPod(3)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod 3 bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 2, 3)) })

	rt.Stop() // containerd stops
	eventually(t, "disconnected", func() bool { ok, _ := b.Health(); return !ok })
	if _, detail := b.Health(); detail == "" {
		t.Error("no reason given for not being connected")
	}
	// It comes back knowing pods 2, 3 and 4 (1 ended meanwhile).
	rt2 := nrifake.Start(t, dir, testPod(2), testPod(3), testPod(4))
	eventually(t, "reconnected", func() bool { ok, _ := b.Health(); return ok })
	rt2.WaitPlugins(t, 1)
	eventually(t, "reconciled", func() bool { return slices.Equal(boundUIDs(f), uids(2, 3, 4)) })
	if err := rt2.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: testPod(2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod 2 checkpointed through the new connection", func() bool { return slices.Equal(boundUIDs(f), uids(3, 4)) })
	if n := b.m.connections; n == nil {
		t.Fatal("no connections counter")
	}
}

// TestRefreshEndsPodsTheRuntimeForgot: containerd relays the end of a pod
// only if it relayed its start since it (re)started (containerd#8426): a
// pod that predates a restart ends unannounced. While pods known from a
// Synchronize only are tracked, each --resync reconnects for a fresh
// Synchronize, which ends the pods gone meanwhile; once every tracked pod
// was announced by the runtime (its RunPodSandbox, or ended by an event),
// the bridge reconnects no more.
func TestRefreshEndsPodsTheRuntimeForgot(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.Resync = 50 * time.Millisecond })
	dir := shortDir(t)
	rt := nrifake.Start(t, dir, testPod(1), testPod(2)) // the restarted containerd lists them
	connect(t, b, rt)
	eventually(t, "synchronized pods bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 2)) })
	ctx := context.Background()
	// Pod 3 starts: the runtime lists it from now on, and relays its start.
	// The bridge reconnects every resync while pods 1 and 2 are
	// unannounced, so a start relayed while no plugin is registered reaches
	// nobody (pod 3 is then bound from the next Synchronize, unannounced):
	// relayed again until the bridge has it announced, as a runtime whose
	// RunPodSandbox reached the plugin would.
	rt.SetPods(testPod(1), testPod(2), testPod(3))
	eventually(t, "pod 3 bound and announced", func() bool {
		if err := rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: testPod(3)}); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		_, unannounced := b.unannounced["uid-003"]
		b.mu.Unlock()
		return !unannounced && slices.Equal(boundUIDs(f), uids(1, 2, 3))
	})

	// Pod 1 ends without an event: only the next Synchronize tells.
	rt.SetPods(testPod(2), testPod(3))
	eventually(t, "pod 1 checkpointed after a refresh", func() bool { return slices.Equal(boundUIDs(f), uids(2, 3)) })
	if n := testutil.ToFloat64(b.m.refreshes); n < 1 {
		t.Errorf("refreshes %v, want at least 1", n)
	}
	if ok, detail := b.Health(); !ok {
		t.Errorf("unhealthy across refreshes: %s", detail)
	}

	// Pod 2's end is relayed (a runtime that relayed its start, or one
	// that relays it anyway): nothing left unannounced, no more refreshes.
	if err := rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: testPod(2)}); err != nil {
		t.Fatal(err)
	}
	rt.SetPods(testPod(3))
	eventually(t, "pod 2 checkpointed", func() bool { return slices.Equal(boundUIDs(f), uids(3)) })
	eventually(t, "nothing unannounced", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.unannounced) == 0
	})
	time.Sleep(100 * time.Millisecond) // a refresh asked meanwhile is done
	before := testutil.ToFloat64(b.m.refreshes)
	time.Sleep(300 * time.Millisecond) // six resyncs
	if after := testutil.ToFloat64(b.m.refreshes); after != before {
		t.Errorf("%v refreshes with no pod unannounced", after-before)
	}
	// Pod 3, announced, was never ended; nothing was bound twice.
	got := strings.Join(f.Events(), ",")
	if strings.Contains(got, "checkpoint uid-003") || strings.Count(got, "bind uid-") != 3 {
		t.Errorf("statsd's events: %v", got)
	}
}

// TestConnectWithoutNRI: no NRI socket (NRI disabled, or containerd not up
// yet): the bridge says why and keeps trying; it connects once the socket
// is there.
func TestConnectWithoutNRI(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	dir := shortDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Connect(ctx, ConnectOptions{Socket: filepath.Join(dir, "nri.sock"), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond)
	if ok, detail := b.Health(); ok || !containsAll(detail, "not connected to NRI", "nri.sock") {
		t.Errorf("Health() = %v, %q", ok, detail)
	}
	nrifake.Start(t, dir, testPod(1))
	eventually(t, "connected", func() bool { ok, _ := b.Health(); return ok })
	eventually(t, "bound", func() bool { return slices.Equal(boundUIDs(f), uids(1)) })
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// stubGoroutines counts the goroutines whose stack is in NRI's plugin stub
// (a Start, a connClosed, the stub's ttrpc server or client).
func stubGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/containerd/nri/pkg/stub.") {
			n++
		}
	}
	return n
}

// TestUnconfiguredRegistrationsLeakNothing: a runtime that accepts the
// plugin's registration and never configures it (nrifake.Silent) is
// dropped after ConfigureTimeout and tried again; each attempt's stub ends
// with it: after 20 attempts the goroutines are as many as after 2, and
// none of the stub's is left once Connect returned.
func TestUnconfiguredRegistrationsLeakNothing(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	rt := nrifake.StartSilent(t, shortDir(t))
	settle := func() int {
		// The least of a few samples: a reconnect may be in flight.
		least := runtime.NumGoroutine()
		for range 10 {
			time.Sleep(20 * time.Millisecond)
			least = min(least, runtime.NumGoroutine())
		}
		return least
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Connect(ctx, ConnectOptions{Socket: rt.Socket, MinBackoff: 5 * time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			ConfigureTimeout: 30 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	waitRegs := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for rt.Registrations() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d registrations within 10s, want %d", rt.Registrations(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitRegs(2)
	early := settle()
	waitRegs(22)
	late := settle()
	stubs := stubGoroutines()
	t.Logf("goroutines after 2 unconfigured registrations %d, after 22 %d; the stub's %d", early, late, stubs)
	if late > early+4 {
		buf := make([]byte, 1<<22)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
		t.Errorf("goroutines grew from %d to %d over 20 unconfigured registrations (the stub's: %d)", early, late, stubs)
	}
	if ok, detail := b.Health(); ok || !strings.Contains(detail, "did not configure") {
		t.Errorf("Health() = %v, %q", ok, detail)
	}
	cancel()
	<-done
	rt.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for stubGoroutines() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := stubGoroutines(); n > 0 {
		t.Errorf("%d goroutines of the NRI stub left after Connect returned", n)
	}
}

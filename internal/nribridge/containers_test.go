package nribridge

// The container set's tests: what Run and UpdateWorkloadContainers carry
// as a pod's containers come and go, across a restart, against a statsd
// that does not know the call, and the cap.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxstats/sandboxstats/internal/nrifake"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// testCtr is the container name of testPod(i); its id is "<name>-<i>".
func testCtr(i int, name string, state api.ContainerState) *api.Container {
	return &api.Container{Id: fmt.Sprintf("%s-%d", name, i), PodSandboxId: fmt.Sprintf("sbx%03d", i), Name: name, State: state}
}

// boundSet is the container set f holds for uid, as "name=id".
func boundSet(f *statsdfake.Lifecycle, uid string) []string {
	return statsdfake.Names(f.Bound()[uid].GetSandbox().GetContainers())
}

// lastUpdate is the last UpdateWorkloadContainers f applied.
func lastUpdate(f *statsdfake.Lifecycle) statsdfake.Update {
	u := f.Updates()
	if len(u) == 0 {
		return statsdfake.Update{}
	}
	return u[len(u)-1]
}

// TestContainerSetFollowsEvents: a runsc pod is bound with the containers
// known then; each one created is sent with the whole set
// (UpdateWorkloadContainers), each one stopped dropped from it; the
// activation (epoch) stays, no Run replaces it; a repeated event sends
// nothing.
func TestContainerSetFollowsEvents(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	p := testPod(1)
	b.RunPodSandbox(p)
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	b.ContainerCreated(p, testCtr(1, "web", api.ContainerState_CONTAINER_CREATED))
	b.ContainerCreated(p, testCtr(1, "sidecar", api.ContainerState_CONTAINER_CREATED))
	want := []string{"web=web-1", "sidecar=sidecar-1"}
	eventually(t, "both containers sent", func() bool { return slices.Equal(lastUpdate(f).Containers, want) })
	epoch := lastUpdate(f).Epoch
	b.ContainerCreated(p, testCtr(1, "web", api.ContainerState_CONTAINER_RUNNING)) // a repeat: nothing to send
	b.ContainerStopped(p, testCtr(1, "web", api.ContainerState_CONTAINER_STOPPED))
	eventually(t, "web dropped", func() bool { return slices.Equal(lastUpdate(f).Containers, []string{"sidecar=sidecar-1"}) })
	b.ContainerRemoved(p, testCtr(1, "web", api.ContainerState_CONTAINER_STOPPED)) // already dropped at its stop
	b.ContainerCreated(p, testCtr(1, "web2", api.ContainerState_CONTAINER_CREATED))
	eventually(t, "a new container added", func() bool {
		return slices.Equal(lastUpdate(f).Containers, []string{"sidecar=sidecar-1", "web2=web2-1"})
	})
	time.Sleep(100 * time.Millisecond)
	if diff := cmp.Diff([]string{"sidecar=sidecar-1", "web2=web2-1"}, boundSet(f, "uid-001")); diff != "" {
		t.Errorf("the binding's set (-want +got):\n%s", diff)
	}
	for _, u := range f.Updates() {
		if u.Epoch != epoch {
			t.Errorf("an update saw epoch %d, the activation's is %d", u.Epoch, epoch)
		}
	}
	events := f.Events()
	if events[0] != "bind uid-001" || slices.ContainsFunc(events[1:], func(e string) bool { return !strings.HasPrefix(e, "update ") }) {
		t.Errorf("statsd's events: %q; want one bind, then updates only", events)
	}
	// At least one update per change, none for the repeats: created web,
	// sidecar (maybe sent together), stopped web, created web2.
	if n := len(f.Updates()); n < 3 || n > 4 {
		t.Errorf("%d updates, want 3 or 4: %v", n, f.Updates())
	}
}

// TestRunNamesTheContainersKnown: a pod whose containers the bridge knows
// before it binds it (a Synchronize listing them) is bound with them; the
// pause container (the sandbox's id) and the containers not live are not
// among them.
func TestRunNamesTheContainersKnown(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	b.Synchronize([]*api.PodSandbox{testPod(1)}, []*api.Container{
		{Id: "sbx001", PodSandboxId: "sbx001", Name: "pause", State: api.ContainerState_CONTAINER_RUNNING},
		testCtr(1, "web", api.ContainerState_CONTAINER_RUNNING),
		testCtr(1, "init", api.ContainerState_CONTAINER_STOPPED),
		testCtr(1, "sidecar", api.ContainerState_CONTAINER_CREATED),
	})
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	got := boundSet(f, "uid-001")
	slices.Sort(got)
	if diff := cmp.Diff([]string{"sidecar=sidecar-1", "web=web-1"}, got); diff != "" {
		t.Errorf("the Run's containers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"bind uid-001"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
}

// TestRestartResendsTheSets: a bridge restarted finds each pod bound with
// the set its predecessor last sent, and sends the current one (the
// runtime's Synchronize lists it), then a Run that is a retry: no new
// activation.
func TestRestartResendsTheSets(t *testing.T) {
	f := fakes(t, 1)[0]
	b1 := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	p := testPod(1)
	b1.RunPodSandbox(p)
	b1.ContainerCreated(p, testCtr(1, "web", api.ContainerState_CONTAINER_CREATED))
	b1.ContainerCreated(p, testCtr(1, "old", api.ContainerState_CONTAINER_CREATED))
	eventually(t, "two containers", func() bool { return len(boundSet(f, "uid-001")) == 2 })
	b1.stop()
	// Meanwhile "old" stopped and "new" came.
	before := len(f.Events())
	b2 := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	b2.Synchronize([]*api.PodSandbox{p}, []*api.Container{
		testCtr(1, "web", api.ContainerState_CONTAINER_RUNNING),
		testCtr(1, "old", api.ContainerState_CONTAINER_STOPPED),
		testCtr(1, "new", api.ContainerState_CONTAINER_RUNNING),
	})
	eventually(t, "the set resent", func() bool {
		got := boundSet(f, "uid-001")
		slices.Sort(got)
		return slices.Equal(got, []string{"new=new-1", "web=web-1"})
	})
	time.Sleep(100 * time.Millisecond)
	if diff := cmp.Diff([]string{"update uid-001", "retry uid-001"}, f.Events()[before:]); diff != "" {
		t.Errorf("statsd's events after the restart (-want +got):\n%s", diff)
	}
}

// TestContainerEventsThroughNRI: the container events and the
// Synchronize's container list as containerd's NRI relays them.
func TestContainerEventsThroughNRI(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	rt := nrifake.Start(t, shortDir(t), testPod(1))
	rt.SetContainers(testCtr(1, "web", api.ContainerState_CONTAINER_RUNNING))
	connect(t, b, rt)
	eventually(t, "bound with web", func() bool { return slices.Equal(boundSet(f, "uid-001"), []string{"web=web-1"}) })
	ctx := context.Background()
	side := testCtr(1, "sidecar", api.ContainerState_CONTAINER_CREATED)
	if err := rt.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: testPod(1), Container: side}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sidecar added", func() bool { return slices.Equal(boundSet(f, "uid-001"), []string{"web=web-1", "sidecar=sidecar-1"}) })
	if _, err := rt.StopContainer(ctx, &api.StopContainerRequest{Pod: testPod(1), Container: testCtr(1, "web", api.ContainerState_CONTAINER_STOPPED)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web dropped", func() bool { return slices.Equal(boundSet(f, "uid-001"), []string{"sidecar=sidecar-1"}) })
	if diff := cmp.Diff([]string{"bind uid-001", "update uid-001", "update uid-001"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
}

// TestOlderStatsdWithoutUpdates: a statsd that answers UNIMPLEMENTED
// (older than UpdateWorkloadContainers) is logged once and counted; each
// change is one call, never retried; the binding stays.
func TestOlderStatsdWithoutUpdates(t *testing.T) {
	f := fakes(t, 1)[0]
	f.SetUpdateUnimplemented(true)
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	p := testPod(1)
	b.RunPodSandbox(p)
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	unimplemented := func() float64 {
		return testutil.ToFloat64(b.m.calls.WithLabelValues(f.LifecycleSocket, "update-containers", "Unimplemented"))
	}
	b.ContainerCreated(p, testCtr(1, "web", api.ContainerState_CONTAINER_CREATED))
	eventually(t, "one call", func() bool { return unimplemented() == 1 })
	b.ContainerCreated(p, testCtr(1, "sidecar", api.ContainerState_CONTAINER_CREATED))
	eventually(t, "a second change, a second call", func() bool { return unimplemented() == 2 })
	time.Sleep(300 * time.Millisecond) // the backoff is 20ms: a retry loop would show
	if n := unimplemented(); n != 2 {
		t.Errorf("%v UNIMPLEMENTED calls, want 2 (one per change, no retry)", n)
	}
	if diff := cmp.Diff([]string{"bind uid-001", "unimplemented uid-001", "unimplemented uid-001"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
	if n := strings.Count(b.log.String(), "does not implement UpdateWorkloadContainers"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, b.log.String())
	}
	if !b.healthyBinding("uid-001") {
		t.Error("the pod's binding is not held as bound")
	}
}

// healthyBinding: uid is bound as far as the bridge knows, nothing pending.
func (tb *testBridge) healthyBinding(uid string) bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, s := range tb.shards {
		if _, ok := s.known[uid]; ok && s.retry[uid] == nil {
			return true
		}
	}
	return false
}

// TestContainerCap: at most 25 containers passed, the first learnt; the
// rest counted, and a container added past the cap pushes none out.
func TestContainerCap(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	p := testPod(1)
	b.RunPodSandbox(p)
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	for i := range 30 {
		b.ContainerCreated(p, testCtr(1, fmt.Sprintf("c%02d", i), api.ContainerState_CONTAINER_CREATED))
	}
	eventually(t, "25 sent", func() bool { return len(boundSet(f, "uid-001")) == 25 })
	time.Sleep(100 * time.Millisecond)
	got := boundSet(f, "uid-001")
	if got[0] != "c00=c00-1" || got[24] != "c24=c24-1" {
		t.Errorf("sent %s .. %s, want c00 .. c24 (the first learnt)", got[0], got[24])
	}
	if n := testutil.ToFloat64(b.m.unactionable.WithLabelValues("containers-left-out")); n < 5 {
		t.Errorf("containers-left-out %v, want at least 5", n)
	}
	b.ContainerStopped(p, testCtr(1, "c03", api.ContainerState_CONTAINER_STOPPED))
	eventually(t, "c25 takes the place freed", func() bool {
		s := boundSet(f, "uid-001")
		return len(s) == 25 && !slices.Contains(s, "c03=c03-1") && slices.Contains(s, "c25=c25-1")
	})
	if slices.ContainsFunc(f.Events(), func(e string) bool { return strings.HasPrefix(e, "replace ") }) {
		t.Errorf("a new activation: %q", f.Events())
	}
}

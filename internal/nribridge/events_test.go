package nribridge

// Pods the bridge binds escaped, ignores or leaves out (split from
// bridge_test.go).

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// TestForeignAndOversizedPods: hostile names and huge labels are bound
// escaped and cut; a pod whose uid statsd cannot take is not bound,
// counted and logged once.
func TestForeignAndOversizedPods(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	hostile := testPod(1)
	hostile.Name = "web\x1b]0;pwned\x07\n"
	hostile.Labels = map[string]string{"sandboxstats.dev/template": strings.Repeat("ü", 1<<20)}
	hostile.Annotations = map[string]string{"other": strings.Repeat("x", 4<<20)}
	b.RunPodSandbox(hostile)
	for _, uid := range []string{"", "has space", strings.Repeat("u", 200), "uid-\x00"} {
		p := testPod(2)
		p.Uid = uid
		b.RunPodSandbox(p)
	}
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	id := f.Bound()["uid-001"].GetIdentity()
	if id.GetActorName() != `web\x1b]0;pwned\a\n` || len(id.GetTemplateName()) > 253 || !strings.HasSuffix(id.GetTemplateName(), " bytes)") {
		t.Errorf("identity %v", id)
	}
	if n := testutil.ToFloat64(b.m.unactionable.WithLabelValues("invalid-pod-uid")); n != 4 {
		t.Errorf("invalid-pod-uid counted %v times, want 4", n)
	}
	eventually(t, "logged", func() bool { return strings.Contains(b.log.String(), "reason=invalid-pod-uid") })
	time.Sleep(50 * time.Millisecond)
	if n := strings.Count(b.log.String(), "reason=invalid-pod-uid"); n != 1 {
		t.Errorf("invalid-pod-uid logged %d times within 10s, want 1 (rate bounded)", n)
	}
}

// TestOtherHandlersIgnored: pods of handlers not watched change nothing.
func TestOtherHandlersIgnored(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.Mapping.Handlers = []string{"runsc", "kata*"} })
	runc := testPod(1)
	runc.RuntimeHandler = ""
	crun := testPod(2)
	crun.RuntimeHandler = "crun"
	b.RunPodSandbox(runc)
	b.RunPodSandbox(crun)
	b.RunPodSandbox(testPod(3))
	eventually(t, "the runsc pod bound", func() bool { return len(f.Bound()) == 1 })
	b.StopPodSandbox(runc)
	time.Sleep(50 * time.Millisecond)
	if diff := cmp.Diff([]string{"bind uid-003"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
	if n := testutil.ToFloat64(b.m.ignored.WithLabelValues("handler")); n != 3 {
		t.Errorf("ignored for their handler: %v, want 3", n)
	}
}

// TestStaleSandboxEvents: the kubelet's new sandbox for a pod replaces the
// old one's binding; the old sandbox's late stop and removal leave the new
// one bound.
func TestStaleSandboxEvents(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	old := testPod(1)
	b.RunPodSandbox(old)
	eventually(t, "bound", func() bool { return f.Bound()["uid-001"].GetSandbox().GetSentryPid() == 10001 })
	renewed := testPod(1)
	renewed.Id, renewed.Pid = "sbx001-attempt1", 20001
	b.RunPodSandbox(renewed)
	eventually(t, "replaced", func() bool { return f.Bound()["uid-001"].GetSandbox().GetSentryPid() == 20001 })
	b.StopPodSandbox(old)
	b.RemovePodSandbox(old)
	time.Sleep(100 * time.Millisecond)
	if diff := cmp.Diff([]string{"bind uid-001", "replace uid-001"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
}

// TestTooManyPods: pods over MaxPods are counted, not tracked.
func TestTooManyPods(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.MaxPods = 3 })
	for i := range 5 {
		b.RunPodSandbox(testPod(i))
	}
	eventually(t, "three bound", func() bool { return len(f.Bound()) == 3 })
	if n := testutil.ToFloat64(b.m.unactionable.WithLabelValues("too-many-pods")); n != 2 {
		t.Errorf("too-many-pods %v, want 2", n)
	}
}

package nribridge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/nrifake"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func TestMain(m *testing.M) {
	// The NRI runtime side the tests run (adaptation) logs through NRI's
	// global logger.
	nrilog.Set(discardNRI{})
	os.Exit(m.Run())
}

type discardNRI struct{}

func (discardNRI) Debugf(context.Context, string, ...any) {}
func (discardNRI) Infof(context.Context, string, ...any)  {}
func (discardNRI) Warnf(context.Context, string, ...any)  {}
func (discardNRI) Errorf(context.Context, string, ...any) {}

// shortDir is a temporary directory with a short path (a Unix socket path
// has at most 107 bytes; t.TempDir's carry the test's name).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "nrib")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// fakes starts n fake statsd daemons.
func fakes(t *testing.T, n int) []*statsdfake.Lifecycle {
	t.Helper()
	var out []*statsdfake.Lifecycle
	for range n {
		out = append(out, statsdfake.StartLifecycle(t, shortDir(t)))
	}
	return out
}

type testBridge struct {
	*Bridge
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	log    *syncBuffer
}

// syncBuffer is a log the test reads while the bridge writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startBridge runs a Bridge over the fakes with short timeouts and
// backoffs until stop or the test's end.
func startBridge(t *testing.T, fs []*statsdfake.Lifecycle, edit func(*Options)) *testBridge {
	t.Helper()
	var sds []Statsd
	for _, f := range fs {
		sds = append(sds, Statsd{Lifecycle: f.LifecycleSocket, Stats: f.StatsSocket})
	}
	logBuf := &syncBuffer{}
	reg := prometheus.NewRegistry()
	opt := Options{
		Mapping: testConfig(), Statsd: sds,
		CallTimeout: 300 * time.Millisecond, Resync: -1, Settle: 100 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(io.MultiWriter(logBuf, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: reg,
	}
	if edit != nil {
		edit(&opt)
	}
	b, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb := &testBridge{Bridge: b, reg: reg, cancel: cancel, done: make(chan struct{}), log: logBuf}
	go func() {
		defer close(tb.done)
		_ = b.Run(ctx)
	}()
	t.Cleanup(tb.stop)
	return tb
}

// stop stops the bridge as a crash would leave statsd: nothing is undone.
func (tb *testBridge) stop() {
	tb.cancel()
	<-tb.done
}

// testWriter logs through t only while the test runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// eventually waits up to 5s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pod is a running runsc pod numbered i.
func testPod(i int) *api.PodSandbox {
	id := fmt.Sprintf("sbx%03d", i)
	return &api.PodSandbox{
		Id: id, Uid: fmt.Sprintf("uid-%03d", i), Name: fmt.Sprintf("web-%d", i), Namespace: "shop",
		Labels:         map[string]string{"sandboxstats.dev/template": "python"},
		RuntimeHandler: "runsc", Pid: uint32(10000 + i),
		Linux: &api.LinuxPodSandbox{CgroupsPath: "/k8s.io/" + id},
	}
}

// testRequest is the request the bridge binds testPod(i) with.
func testRequest(i int) *sandboxstatsv1.RunWorkloadRequest {
	p := testPod(i)
	id, _ := testConfig().IdentityOf(p)
	ref, _ := RefOf(SandboxOf(KindGVisor, p), nil, Kata{})
	return &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: ref}
}

func boundUIDs(f *statsdfake.Lifecycle) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for uid := range f.Bound() {
			if !yield(uid) {
				return
			}
		}
	})
}

func uids(is ...int) []string {
	var out []string
	for _, i := range is {
		out = append(out, fmt.Sprintf("uid-%03d", i))
	}
	slices.Sort(out)
	return out
}

// TestRunStopBindsAndCheckpoints: a pod is bound with the mapped request,
// its stop checkpoints it; a repeated event binds nothing twice.
func TestRunStopBindsAndCheckpoints(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	p := testPod(1)
	b.RunPodSandbox(p)
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	want := &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "uid-001", ActorName: "web-1", ActorNamespace: "shop", TemplateNamespace: "shop", TemplateName: "python"},
		Sandbox:  &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, SentryPid: 10001},
	}
	if diff := cmp.Diff(want, f.Bound()["uid-001"], protocmp.Transform()); diff != "" {
		t.Errorf("bound (-want +got):\n%s", diff)
	}
	b.RunPodSandbox(p) // the same event again: the request is the one bound
	b.StopPodSandbox(p)
	eventually(t, "checkpointed", func() bool { return len(f.Bound()) == 0 })
	b.RemovePodSandbox(p)
	time.Sleep(50 * time.Millisecond)
	if diff := cmp.Diff([]string{"bind uid-001", "checkpoint uid-001 runtime-stopped"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
	for _, want := range []string{`msg="bound pod" uid=uid-001 namespace=shop name=web-1 sandbox=sbx001 kind=gvisor`, `msg="checkpointed pod" uid=uid-001`} {
		if !strings.Contains(b.log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, b.log.String())
		}
	}
}

// TestEventsAnsweredWhileStatsdHangs: with statsd hung (as SIGSTOPped),
// every event returns at once; the bindings follow once it answers.
func TestEventsAnsweredWhileStatsdHangs(t *testing.T) {
	f := fakes(t, 1)[0]
	f.Hang(true)
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	var slowest time.Duration
	timed := func(fn func()) {
		start := time.Now()
		fn()
		slowest = max(slowest, time.Since(start))
	}
	for i := range 50 {
		timed(func() { b.RunPodSandbox(testPod(i)) })
	}
	<-f.Arrived() // a call is hanging in statsd
	for i := range 25 {
		timed(func() { b.StopPodSandbox(testPod(i)) })
		timed(func() { b.RemovePodSandbox(testPod(i)) })
	}
	timed(func() {
		var pods []*api.PodSandbox
		for i := 25; i < 50; i++ {
			pods = append(pods, testPod(i))
		}
		b.Synchronize(pods, nil)
	})
	if slowest > 20*time.Millisecond {
		t.Errorf("the slowest event took %s with statsd hung", slowest)
	}
	f.Hang(false)
	var want []int
	for i := 25; i < 50; i++ {
		want = append(want, i)
	}
	eventually(t, "the running pods bound", func() bool { return slices.Equal(boundUIDs(f), uids(want...)) })
}

// TestEventsAnsweredWhileStatsdHangsThroughNRI: the same through a real NRI
// runtime side: containerd's RunPodSandbox, StopPodSandbox and
// RemovePodSandbox wait for the plugin, and the bridge answers at once.
func TestEventsAnsweredWhileStatsdHangsThroughNRI(t *testing.T) {
	f := fakes(t, 1)[0]
	f.Hang(true)
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	rt := nrifake.Start(t, shortDir(t))
	connect(t, b, rt)
	ctx := context.Background()
	var slowest time.Duration
	for i := range 20 {
		p := testPod(i)
		start := time.Now()
		if err := rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: p}); err != nil {
			t.Fatalf("RunPodSandbox: %v", err)
		}
		if i%2 == 0 {
			if err := rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: p}); err != nil {
				t.Fatalf("StopPodSandbox: %v", err)
			}
			if err := rt.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: p}); err != nil {
				t.Fatalf("RemovePodSandbox: %v", err)
			}
		}
		slowest = max(slowest, time.Since(start))
	}
	if slowest > 100*time.Millisecond {
		t.Errorf("the slowest pod's events took %s through NRI with statsd hung", slowest)
	}
	f.Hang(false)
	eventually(t, "the odd pods bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 3, 5, 7, 9, 11, 13, 15, 17, 19)) })
}

// TestSynchronizeReconcilesBothWays: running pods not bound are bound
// (those bound already are a retry), bindings whose pod is gone or
// stopped are checkpointed, a stopped pod is not bound.
func TestSynchronizeReconcilesBothWays(t *testing.T) {
	f := fakes(t, 1)[0]
	req := testRequest
	f.Preload(req(1), req(2), req(3))
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	stopped := testPod(3)
	stopped.Pid = 0 // stopped, not removed: Synchronize lists it without a task
	b.Synchronize([]*api.PodSandbox{testPod(1), stopped, testPod(4), testPod(5)}, nil)
	eventually(t, "reconciled", func() bool { return slices.Equal(boundUIDs(f), uids(1, 4, 5)) })
	time.Sleep(50 * time.Millisecond)
	got := f.Events()
	slices.Sort(got)
	// uid-001 bound before the bridge started (its request unknown): its
	// container set sent, then its Run a retry.
	if diff := cmp.Diff([]string{"bind uid-004", "bind uid-005", "checkpoint uid-002 runtime-stopped", "checkpoint uid-003 runtime-stopped", "retry uid-001", "update uid-001"}, got); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
}

// TestRestartBindsNothingTwice: a bridge killed while pods come and go, and
// a new one started over the same statsd, binds each running pod exactly
// once and ends each gone pod's activation once.
func TestRestartBindsNothingTwice(t *testing.T) {
	fs := fakes(t, 2)
	b1 := startBridge(t, fs, nil)
	for i := range 8 {
		b1.RunPodSandbox(testPod(i))
	}
	eventually(t, "bound", func() bool { return len(fs[0].Bound())+len(fs[1].Bound()) == 8 })
	b1.StopPodSandbox(testPod(0))
	eventually(t, "pod 0 checkpointed", func() bool { _, a := fs[0].Bound()["uid-000"]; _, b := fs[1].Bound()["uid-000"]; return !a && !b })
	b1.stop() // killed: nothing undone

	// Meanwhile pods 1 and 2 ended and 8 started; the runtime's
	// Synchronize at the new bridge's connect says so.
	var running []*api.PodSandbox
	for _, i := range []int{3, 4, 5, 6, 7, 8} {
		running = append(running, testPod(i))
	}
	before := [][]string{fs[0].Events(), fs[1].Events()}
	for round := range 2 { // and once more: a second restart changes nothing
		b2 := startBridge(t, fs, nil)
		b2.Synchronize(running, nil)
		eventually(t, "reconciled", func() bool {
			return slices.Equal(slices.Sorted(slices.Values(append(boundUIDs(fs[0]), boundUIDs(fs[1])...))), uids(3, 4, 5, 6, 7, 8))
		})
		time.Sleep(100 * time.Millisecond)
		b2.stop()
		var after []string
		for i, f := range fs {
			after = append(after, f.Events()[len(before[i]):]...)
		}
		slices.Sort(after)
		// Each pod found bound: its container set sent, then its Run a retry.
		want := []string{"retry uid-003", "retry uid-004", "retry uid-005", "retry uid-006", "retry uid-007"}
		if round == 0 {
			want = append([]string{"bind uid-008", "checkpoint uid-001 runtime-stopped", "checkpoint uid-002 runtime-stopped"}, want...)
		} else {
			want = append(want, "retry uid-008")
		}
		for _, e := range slices.Clone(want) {
			if uid, ok := strings.CutPrefix(e, "retry "); ok {
				want = append(want, "update "+uid)
			}
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, after); diff != "" {
			t.Errorf("round %d: statsd's events after the restart (-want +got):\n%s", round, diff)
		}
		before = [][]string{fs[0].Events(), fs[1].Events()}
	}
	// Each pod is on the statsd its uid hashes to, and only there.
	for _, i := range []int{3, 4, 5, 6, 7, 8} {
		n := 0
		for _, f := range fs {
			if _, ok := f.Bound()[fmt.Sprintf("uid-%03d", i)]; ok {
				n++
			}
		}
		if n != 1 {
			t.Errorf("pod %d bound on %d statsd", i, n)
		}
	}
}

// TestHungStatsdHoldsOnlyItsOwnPods: pods placed on a hung statsd wait;
// the others' are bound as ever.
func TestHungStatsdHoldsOnlyItsOwnPods(t *testing.T) {
	fs := fakes(t, 3)
	fs[1].Hang(true)
	b := startBridge(t, fs, nil)
	for i := range 30 {
		b.RunPodSandbox(testPod(i))
	}
	var onHung, elsewhere int
	for i := range 30 {
		if b.firstChoice(fmt.Sprintf("uid-%03d", i)) == 1 {
			onHung++
		} else {
			elsewhere++
		}
	}
	if onHung == 0 || elsewhere == 0 {
		t.Fatalf("placement: %d on the hung statsd, %d elsewhere", onHung, elsewhere)
	}
	eventually(t, "the others bound", func() bool { return len(fs[0].Bound())+len(fs[2].Bound()) == elsewhere })
	eventually(t, "a run call to the hung statsd timed out", func() bool {
		return testutil.ToFloat64(b.m.calls.WithLabelValues(fs[1].LifecycleSocket, "run", "DeadlineExceeded")) > 0
	})
	fs[1].Hang(false)
	eventually(t, "the hung one's bound once it answers", func() bool { return len(fs[1].Bound()) == onHung })
}

// TestTransientFailuresRetried: a full ceiling and a full disk are retried
// with backoff until they clear.
func TestTransientFailuresRetried(t *testing.T) {
	f := fakes(t, 1)[0]
	f.SetMaxWorkloads(1)
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	b.RunPodSandbox(testPod(1))
	eventually(t, "the first bound", func() bool { return len(f.Bound()) == 1 })
	b.RunPodSandbox(testPod(2))
	eventually(t, "the second refused", func() bool { return slices.Contains(f.Events(), "refuse uid-002 TOO_MANY_WORKLOADS") })
	b.StopPodSandbox(testPod(1))
	eventually(t, "the second bound once the first ended", func() bool { return slices.Equal(boundUIDs(f), uids(2)) })

	f.SetMaxWorkloads(32)
	f.SetLifecycleError(statsdfake.Status(codes.Unavailable, sandboxstatsv1.ErrorReason_ERROR_REASON_STATE_NOT_PERSISTED, "write binding.json: no space left on device"))
	b.RunPodSandbox(testPod(3))
	eventually(t, "tried", func() bool {
		// A Run whose outcome is not known is followed by an
		// UpdateWorkloadContainers (the pod may be bound).
		return testutil.ToFloat64(b.m.calls.WithLabelValues(f.LifecycleSocket, "run", "STATE_NOT_PERSISTED"))+
			testutil.ToFloat64(b.m.calls.WithLabelValues(f.LifecycleSocket, "update-containers", "STATE_NOT_PERSISTED")) >= 2
	})
	f.SetLifecycleError(nil)
	eventually(t, "bound once the disk has room", func() bool { return slices.Equal(boundUIDs(f), uids(2, 3)) })
}

// TestKataContainersSettle: a Kata pod is bound at once with its sandbox's
// container, and its containers' changes sent once they settle (one
// UpdateWorkloadContainers for a burst, never a new activation).
func TestKataContainersSettle(t *testing.T) {
	root := shortDir(t)
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.Kata = KataLayout{Root: root}; o.Settle = 200 * time.Millisecond })
	p := &api.PodSandbox{Id: "kata1", Uid: "uid-k", Name: "vm", Namespace: "shop", RuntimeHandler: "kata-clh", Pid: 777}
	b.RunPodSandbox(p)
	eventually(t, "not yet laid out: retried", func() bool { return testutil.ToFloat64(b.m.unactionable.WithLabelValues("kata-not-yet")) >= 2 })
	layOutKata1(t, root)
	eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
	want := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
		AgentAddress: "hvsock:///run/vc/vm/kata1/clh.sock:1024", ContainerIds: []string{"kata1"}, Containers: []*sandboxstatsv1.ContainerRef{{Id: "kata1"}}, VmmPid: 4242}
	if diff := cmp.Diff(want, f.Bound()["uid-k"].GetSandbox(), protocmp.Transform()); diff != "" {
		t.Errorf("first binding (-want +got):\n%s", diff)
	}
	ctr := func(id string) *api.Container { return &api.Container{Id: id, PodSandboxId: "kata1", Name: "n" + id} }
	for _, id := range []string{"c1", "c2", "c3"} {
		b.ContainerCreated(p, ctr(id))
	}
	eventually(t, "the containers bound", func() bool { return len(f.Bound()["uid-k"].GetSandbox().GetContainers()) == 4 })
	if diff := cmp.Diff([]string{"=kata1", "nc1=c1", "nc2=c2", "nc3=c3"}, statsdfake.Names(f.Bound()["uid-k"].GetSandbox().GetContainers())); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		b.ContainerStopped(p, ctr(id))
	}
	b.StopPodSandbox(p)
	eventually(t, "checkpointed", func() bool { return len(f.Bound()) == 0 })
	time.Sleep(300 * time.Millisecond)
	if diff := cmp.Diff([]string{"bind uid-k", "update uid-k", "checkpoint uid-k runtime-stopped"}, f.Events()); diff != "" {
		t.Errorf("statsd's events (-want +got):\n%s", diff)
	}
}

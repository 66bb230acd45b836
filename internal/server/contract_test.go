package server

import (
	"context"

	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// fakeSource is an in-process Source with a scripted answer.
type fakeSource struct {
	mu      sync.Mutex
	reading source.Reading
	err     error
	panics  bool
	calls   atomic.Int32
	closed  atomic.Int32
}

func (f *fakeSource) Sample(ctx context.Context) (source.Reading, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics {
		panic("fake source panics")
	}
	return f.reading, f.err
}

func (f *fakeSource) Close() error { f.closed.Add(1); return nil }

func (f *fakeSource) set(r source.Reading, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reading, f.err = r, err
}

var (
	fixedNow  = time.Unix(1_800_000_000, 0)
	peak      = uint64(300 << 20)
	procs     = uint32(4)
	cgroupRdg = source.Reading{
		Kind: source.KindCgroup, Detail: "cgroup v1 (hybrid) /sys/fs/cgroup/memory/statstest",
		MemoryCurrentBytes: 200 << 20, MemoryPeakBytes: &peak, MemoryWorkingSetBytes: 190 << 20,
		CPUUsageUsec: cpuUsec(1_000_000), SandboxProcesses: &procs,
	}
	identA = &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-a", ActorName: "a", ActorNamespace: "ns", TemplateNamespace: "tns", TemplateName: "tpl"}
	identB = &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-b"}
	gvRef  = &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/statstest"}
)

// fakeHost is an in-process HostSampler answering one domain host view.
type fakeHost struct{ view *source.HostStats }

func (f *fakeHost) SampleHost(context.Context) (*source.HostStats, error) { return f.view, nil }
func (f *fakeHost) Close() error                                          { return nil }

type harness struct {
	store     *identity.Store
	stats     *StatsService
	src       *fakeSource // the source every Open returns, unless open is set
	open      func() source.Source
	host      source.HostSampler // the host sampler every Open returns (nil: none)
	opens     atomic.Int32
	client    sandboxstatsv1.WorkloadStatsServiceClient
	lifecycle sandboxstatsv1.WorkloadLifecycleServiceClient
}

// newHarness serves both services over bufconn with the real interceptors;
// each of with changes the store's config before the store is made.
func newHarness(t testing.TB, with ...func(*identity.Config)) *harness {
	t.Helper()
	h := &harness{src: &fakeSource{reading: cgroupRdg}}
	epochClock := fixedNow
	var clockMu sync.Mutex
	cfg := identity.Config{
		Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			h.opens.Add(1)
			if h.open != nil {
				return h.open(), h.host, nil
			}
			return h.src, h.host, nil
		},
		Now: func() time.Time {
			clockMu.Lock()
			defer clockMu.Unlock()
			epochClock = epochClock.Add(time.Second)
			return epochClock
		},
	}
	for _, f := range with {
		f(&cfg)
	}
	store, err := identity.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.store = store
	h.stats = NewStatsService(store, func() time.Time { return fixedNow }, nil)

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(append(h.stats.ServerOptions(), UnaryInterceptors(slog.New(slog.DiscardHandler)))...)
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, h.stats)
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(srv, NewLifecycleService(store, nil))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.client = sandboxstatsv1.NewWorkloadStatsServiceClient(conn)
	h.lifecycle = sandboxstatsv1.NewWorkloadLifecycleServiceClient(conn)
	return h
}

func (h *harness) run(t testing.TB, id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) int64 {
	t.Helper()
	resp, err := h.lifecycle.RunWorkload(context.Background(), &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: ref})
	if err != nil {
		t.Fatalf("RunWorkload: %v", err)
	}
	return resp.GetEpochUnixNano()
}

func wantStatus(t *testing.T, err error, code codes.Code, reason sandboxstatsv1.ErrorReason) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("code = %v (%v), want %v", got, err, code)
	}
	if got, want := api.ReasonOf(err), api.Reason(reason); got != want {
		t.Fatalf("reason = %q (%v), want %q", got, err, want)
	}
}

// TestStatsWorkloadErrorContract has one case per row of the error table.
func TestStatsWorkloadErrorContract(t *testing.T) {
	ctx := context.Background()
	t.Run("INVALID_ARGUMENT INVALID_ACTOR_UID", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		for _, uid := range []string{"", strings.Repeat("x", 129), "bad uid", "nul\x00"} {
			_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: uid})
			wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_ACTOR_UID)
		}
	})
	t.Run("FAILED_PRECONDITION NO_WORKLOAD", func(t *testing.T) {
		h := newHarness(t)
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
	})
	t.Run("FAILED_PRECONDITION ACTOR_MISMATCH", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-b"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
		if n := h.src.calls.Load(); n != 0 {
			t.Errorf("source read %d times for a mismatched actor, want 0", n)
		}
	})
	t.Run("FAILED_PRECONDITION ACTOR_CHANGED", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		// A reader that swaps the binding mid-read: checkpoint A, bind B.
		h.stats.afterRead = func() {
			h.stats.afterRead = nil
			if _, err := h.store.Release(context.Background(), "actor-a"); err != nil {
				t.Error(err)
			}
			if _, _, err := h.store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "actor-b"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/b"}); err != nil {
				t.Error(err)
			}
		}
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED)
	})
	t.Run("UNAVAILABLE NOT_MEASURABLE", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.src.set(source.Reading{}, fmt.Errorf("gvisor: cgroup /statstest: %w", source.ErrNotMeasurable))
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.Unavailable, sandboxstatsv1.ErrorReason_ERROR_REASON_NOT_MEASURABLE)
	})
	t.Run("DEADLINE_EXCEEDED READ_TIMEOUT", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.src.set(source.Reading{}, fmt.Errorf("%w: /sys/fs/cgroup/memory.current: %w", source.ErrTimeout, context.DeadlineExceeded))
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.DeadlineExceeded, sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT)
	})
	t.Run("RESOURCE_EXHAUSTED TOO_MANY_READS", func(t *testing.T) {
		h := newHarness(t)
		h.stats.WithMaxReads(1)
		open := make(chan struct{})
		var reads atomic.Int32
		h.open = func() source.Source {
			return &gatedSource{fakeSource: fakeSource{reading: cgroupRdg}, open: open, reads: &reads}
		}
		h.run(t, identA, gvRef)
		held := make(chan error, 1)
		go func() {
			_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
			held <- err
		}()
		if !waitFor(func() bool { return reads.Load() == 1 }) {
			t.Fatal("the first read never reached its source")
		}
		_, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		wantStatus(t, err, codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS)
		if n := reads.Load(); n != 1 {
			t.Errorf("source read %d times, want only the first read's", n)
		}
		close(open)
		if err := <-held; err != nil {
			t.Fatalf("the read holding the slot: %v", err)
		}
		// Its slot is left once it is answered.
		if !waitFor(func() bool {
			_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
			return err == nil
		}) {
			t.Error("no read served after the first was answered")
		}
	})
	t.Run("INTERNAL MALFORMED_SOURCE", func(t *testing.T) {
		h := newHarness(t)
		h.run(t, identA, gvRef)
		h.src.set(source.Reading{}, fmt.Errorf("%w: /x/memory.current: token %q", source.ErrMalformed, "max"))
		_, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		wantStatus(t, err, codes.Internal, sandboxstatsv1.ErrorReason_ERROR_REASON_MALFORMED_SOURCE)
		if !strings.Contains(status.Convert(err).Message(), "/x/memory.current") {
			t.Errorf("message %q does not name the path", status.Convert(err).Message())
		}
	})
}

func TestStatsWorkloadSample(t *testing.T) {
	h := newHarness(t)
	epoch := h.run(t, identA, gvRef)
	resp, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	want := &sandboxstatsv1.WorkloadStatsSample{
		ActorUid: "actor-a", ActorName: "a", ActorNamespace: "ns", TemplateNamespace: "tns", TemplateName: "tpl",
		SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source:       sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		SourceDetail: cgroupRdg.Detail, MemoryCurrentBytes: 200 << 20, MemoryPeakBytes: proto.Uint64(300 << 20),
		MemoryWorkingSetBytes: 190 << 20, CpuUsageUsec: proto.Uint64(1_000_000), ObservedAtUnixNano: fixedNow.UnixNano(),
		EpochUnixNano: epoch, SandboxProcesses: proto.Uint32(4),
		EpochBaseline: &sandboxstatsv1.EpochBaseline{Kind: sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START, ObservedAtUnixNano: epoch},
	}
	if diff := cmp.Diff(want, resp.GetSample(), protocmp.Transform()); diff != "" {
		t.Errorf("sample (-want +got):\n%s", diff)
	}

	t.Run("absent peak stays absent", func(t *testing.T) {
		r := cgroupRdg
		r.MemoryPeakBytes = nil
		r.Absent = []source.Absent{{Field: "memory_peak_bytes", Reason: "memory.peak not offered by this kernel"}}
		h.src.set(r, nil)
		resp, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSample().MemoryPeakBytes != nil {
			t.Errorf("peak = %d, want absent", resp.GetSample().GetMemoryPeakBytes())
		}
		if len(resp.GetSample().GetAbsent()) != 1 {
			t.Errorf("absent = %v, want the peak's reason", resp.GetSample().GetAbsent())
		}
	})
	t.Run("include_host without a host sampler says why", func(t *testing.T) {
		h.src.set(cgroupRdg, nil)
		resp, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a", IncludeHost: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSample().GetHost().GetUnavailableReason() == "" {
			t.Error("host view absent without a reason")
		}
		resp, err = h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil || resp.GetSample().GetHost() != nil {
			t.Errorf("host filled without include_host: %v, %v", resp.GetSample().GetHost(), err)
		}
	})
}

func TestPanicIsRecovered(t *testing.T) {
	h := newHarness(t)
	h.run(t, identA, gvRef)
	h.src.mu.Lock()
	h.src.panics = true
	h.src.mu.Unlock()
	_, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if status.Code(err) != codes.Internal {
		t.Fatalf("code = %v, want Internal", status.Code(err))
	}
	h.src.mu.Lock()
	h.src.panics = false
	h.src.mu.Unlock()
	if _, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatalf("server did not survive a panic: %v", err)
	}
}

func TestReasonsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for v := range sandboxstatsv1.ErrorReason_name {
		r := api.Reason(sandboxstatsv1.ErrorReason(v))
		if seen[r] {
			t.Fatalf("reason %q twice", r)
		}
		seen[r] = true
	}
}

// BenchmarkStatsWorkload measures one StatsWorkload over bufconn with a fake
// source: the daemon's own cost per poll.
func BenchmarkStatsWorkload(b *testing.B) {
	h := newHarness(b)
	h.run(b, identA, gvRef)
	req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.client.StatsWorkload(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuUsec returns a CPU counter value for a source.Reading.
func cpuUsec(v uint64) *uint64 { return &v }

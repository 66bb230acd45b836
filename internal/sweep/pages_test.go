package sweep

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// paddedSource answers a cgroup reading with an 8 KiB detail: an ended
// record of about 8.5 KiB, six to a page.
type paddedSource struct{}

func (paddedSource) Sample(context.Context) (source.Reading, error) {
	cpu := uint64(1_000_000)
	return source.Reading{Kind: source.KindCgroup, Detail: strings.Repeat("d", 8<<10), MemoryCurrentBytes: 1 << 20, CPUUsageUsec: &cpu}, nil
}
func (paddedSource) Close() error { return nil }

// realDaemon is statsd's read service (internal/server over an identity
// store) on a Unix socket, with 64 activations ended and actor-a bound.
// Before each ListEndedActivations call it runs churn, if set.
type realDaemon struct {
	socket string
	store  *identity.Store
	pages  atomic.Int32 // ListEndedActivations calls
	mu     sync.Mutex
	churn  func()
}

func startRealDaemon(t *testing.T) *realDaemon {
	t.Helper()
	var (
		clockMu sync.Mutex
		clock   = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	)
	store, err := identity.NewStore(identity.Config{
		Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) { return paddedSource{}, nil, nil },
		Now: func() time.Time {
			clockMu.Lock()
			defer clockMu.Unlock()
			clock = clock.Add(time.Second)
			return clock
		},
		EndedRetention: 1 << 62,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	d := &realDaemon{socket: filepath.Join(t.TempDir(), "statsd.sock"), store: store}
	for range identity.DefaultEndedMax {
		d.cycle(t)
	}
	d.bind(t)
	ln, err := net.Listen("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasSuffix(info.FullMethod, "/ListEndedActivations") {
			d.pages.Add(1)
			d.mu.Lock()
			if d.churn != nil {
				d.churn()
			}
			d.mu.Unlock()
		}
		return h(ctx, req)
	}))
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, server.NewStatsService(store, nil, nil))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return d
}

var actorA = identity.Identity{ActorUID: "actor-a", TemplateNamespace: "templates", TemplateName: "python"}

func (d *realDaemon) bind(t testing.TB) {
	t.Helper()
	if _, _, err := d.store.Bind(context.Background(), identity.OpRun, actorA, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sbx"}); err != nil {
		t.Fatal(err)
	}
}

// cycle binds actor-a and checkpoints it: one more ended record (the
// oldest dropped past 64).
func (d *realDaemon) cycle(t testing.TB) {
	t.Helper()
	d.bind(t)
	if _, err := d.store.Release(context.Background(), actorA.ActorUID); err != nil {
		t.Fatal(err)
	}
}

func keys(ended []*sandboxstatsv1.EndedActivation) []string {
	var out []string
	for _, e := range ended {
		out = append(out, fmt.Sprintf("%s/%d", e.GetIdentity().GetActorUid(), e.GetEpochUnixNano()))
	}
	return out
}

func storeKeys(es []*identity.Ended) []string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s/%d", e.Identity.ActorUID, e.EpochUnixNano))
	}
	return out
}

// TestPollReadsEveryPage: a poll (Config's and a Pool's) reads every page
// of a real statsd's ended activations: all 64 records (550 KiB), once
// each, oldest first; and while activations end between its calls (the
// oldest records dropped), every record kept to the end once, with the
// sample of the activation whose record came in a later page dropped.
func TestPollReadsEveryPage(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Concurrency: 1, Timeout: 10 * time.Second}
	t.Run("still", func(t *testing.T) {
		d := startRealDaemon(t)
		for name, poll := range map[string]func() []DaemonResult{
			"config": func() []DaemonResult { return cfg.PollAll(ctx, []string{d.socket}) },
			"pool": func() []DaemonResult {
				p := cfg.NewPool()
				defer p.Close()
				return p.PollAll(ctx, []string{d.socket})
			},
		} {
			before := d.pages.Load()
			r := poll()[0]
			if r.Status != StatusOK || len(r.Samples) != 1 || r.EndedErr != nil {
				t.Fatalf("%s: status %s, %d samples, ended error %v", name, r.Status, len(r.Samples), r.EndedErr)
			}
			if diff := cmp.Diff(storeKeys(d.store.Ended()), keys(r.Ended)); diff != "" {
				t.Errorf("%s: ended (-kept +polled):\n%s", name, diff)
			}
			// The ended log is the first answer's: its lowest sequence is
			// the oldest record read, however many pages followed.
			wantLog := &sandboxstatsv1.EndedLog{InstanceId: d.store.EndedLog().InstanceID, LowestSequence: 1, NextSequence: 65}
			if diff := cmp.Diff(wantLog, r.EndedLog, protocmp.Transform()); diff != "" || r.Ended[0].GetSequence() != 1 {
				t.Errorf("%s: ended log (-want +got):\n%s\nfirst record #%d", name, diff, r.Ended[0].GetSequence())
			}
			t.Logf("%s: %d records: StatsActiveWorkloads' and %d pages after it", name, len(r.Ended), d.pages.Load()-before)
			if d.pages.Load()-before < 5 {
				t.Errorf("%s: %d pages for 64 records of 8.5 KiB", name, d.pages.Load()-before)
			}
		}
	})
	t.Run("activations ending between pages", func(t *testing.T) {
		d := startRealDaemon(t)
		sampled := d.store.Bound("actor-a").EpochUnixNano
		first := true
		d.churn = func() {
			if first { // the sampled activation ends, another begins
				first = false
				if _, err := d.store.Release(ctx, actorA.ActorUID); err != nil {
					t.Error(err)
				}
				d.bind(t)
				return
			}
			d.cycle(t)
		}
		r := cfg.PollAll(ctx, []string{d.socket})[0]
		if r.EndedErr != nil {
			t.Fatal(r.EndedErr)
		}
		if lowest := r.EndedLog.GetLowestSequence(); lowest != r.Ended[0].GetSequence() || lowest == 0 {
			t.Errorf("ended log's lowest sequence %d, the first record read #%d: not the first answer's", lowest, r.Ended[0].GetSequence())
		}
		got, seen := keys(r.Ended), map[string]bool{}
		for _, k := range got {
			if seen[k] {
				t.Errorf("record %s read twice", k)
			}
			seen[k] = true
		}
		for _, k := range storeKeys(d.store.Ended()) {
			if !seen[k] {
				t.Errorf("record %s kept to the end, never read", k)
			}
		}
		if !seen[fmt.Sprintf("actor-a/%d", sampled)] {
			t.Error("the sampled activation's record was not read")
		}
		if r.Status != StatusNoSample || len(r.Samples) != 0 {
			t.Errorf("status %s with %d samples: the sample beside its own record (read later) was kept", r.Status, len(r.Samples))
		}
		t.Logf("%d records read in %d pages, %d kept at the end; status %s: %s", len(got), d.pages.Load(), len(d.store.Ended()), r.Status, r.NoSampleDetail)
	})
}

// pagedFake is a daemon whose pages are scripted: StatsActiveWorkloads
// answers no sample, one record and the token "0"; ListEndedActivations
// answers page(token).
type pagedFake struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	page  func(token string) (*sandboxstatsv1.ListEndedActivationsResponse, error)
	calls atomic.Int32
}

func ended(i int, pad int) *sandboxstatsv1.EndedActivation {
	return &sandboxstatsv1.EndedActivation{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("a%d", i)},
		EpochUnixNano: int64(i), FinalReason: strings.Repeat("r", pad)}
}

func (f *pagedFake) StatsActiveWorkloads(context.Context, *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		Ended: []*sandboxstatsv1.EndedActivation{ended(0, 0)}, EndedNextPageToken: "0"}, nil
}

func (f *pagedFake) ListEndedActivations(_ context.Context, req *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	f.calls.Add(1)
	return f.page(req.GetPageToken())
}

func startPagedFake(t *testing.T, page func(token string) (*sandboxstatsv1.ListEndedActivationsResponse, error)) (*pagedFake, string) {
	t.Helper()
	f := &pagedFake{page: page}
	socket := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return f, socket
}

// next is the token after token: its number plus one.
func next(token string) (int, string) {
	var n int
	fmt.Sscan(token, &n)
	return n + 1, fmt.Sprint(n + 1)
}

// TestEndedPagesBounded: the pages a daemon gives are read within the
// limits (MaxEnded records and pages, MaxReplyBytes bytes in all): a
// daemon paging forever, one sending an empty page with a token, and one
// sending too many bytes have their ended activations dropped whole; a
// page that fails keeps the pages before it.
func TestEndedPagesBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		limits    Limits
		page      func(token string) (*sandboxstatsv1.ListEndedActivationsResponse, error)
		wantCap   bool
		wantEnded int
		maxCalls  int32
	}{
		{name: "pages forever", limits: Limits{MaxEnded: 10}, wantCap: true, maxCalls: 10,
			page: func(tok string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
				n, nt := next(tok)
				return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{ended(n, 0)}, NextPageToken: nt}, nil
			}},
		{name: "an empty page with a token", wantCap: true, maxCalls: 1,
			page: func(string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
				return &sandboxstatsv1.ListEndedActivationsResponse{NextPageToken: "again"}, nil
			}},
		{name: "too many bytes", limits: Limits{MaxReplyBytes: 64 << 10}, wantCap: true, maxCalls: 5,
			page: func(tok string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
				n, nt := next(tok)
				return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{ended(n, 16<<10)}, NextPageToken: nt}, nil
			}},
		{name: "the third page fails", wantEnded: 3, maxCalls: 3,
			page: func(tok string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
				n, nt := next(tok)
				if n == 3 {
					return nil, status.Error(codes.Unavailable, "gone")
				}
				return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{ended(n, 0)}, NextPageToken: nt}, nil
			}},
		{name: "three pages", wantEnded: 4, maxCalls: 3,
			page: func(tok string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
				n, nt := next(tok)
				if n == 3 {
					nt = ""
				}
				return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{ended(n, 0)}, NextPageToken: nt}, nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, socket := startPagedFake(t, tc.page)
			r := Config{Concurrency: 1, Timeout: 10 * time.Second, Limits: tc.limits}.PollAll(ctx, []string{socket})[0]
			capped := len(r.Capped) == 1 && r.Capped[0] == "ended"
			if capped != tc.wantCap || len(r.Ended) != tc.wantEnded || (tc.wantCap || tc.wantEnded == 3) != (r.EndedErr != nil) {
				t.Errorf("capped %v, %d records, ended error %v; want capped %v, %d records", r.Capped, len(r.Ended), r.EndedErr, tc.wantCap, tc.wantEnded)
			}
			if n := f.calls.Load(); n > tc.maxCalls {
				t.Errorf("%d pages asked for, want at most %d", n, tc.maxCalls)
			}
			if r.Status != StatusNoSample {
				t.Errorf("status %s: the ended activations' pages decide nothing of the sample", r.Status)
			}
		})
	}
}

// TestListEnded: statsctl's reader of every page, over the real statsd.
func TestListEnded(t *testing.T) {
	d := startRealDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := Config{}.poller().dial(d.socket, socketFile{})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.cc.Close()
	got, err := ListEnded(ctx, dc.client, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(storeKeys(d.store.Ended()), keys(got)); diff != "" {
		t.Errorf("ListEnded (-kept +read):\n%s", diff)
	}
	if _, err := ListEnded(ctx, dc.client, Limits{MaxEnded: 10}); !errors.Is(err, errEndedCapped) {
		t.Errorf("64 records with MaxEnded 10: %v", err)
	}
	t.Logf("%d records, %d bytes, in %d pages", len(got), proto.Size(&sandboxstatsv1.ListEndedActivationsResponse{Ended: got}), d.pages.Load())
}

// TestFirstPageLog: the ended log ListEndedActivations' pages give (the
// last page's) is told as the first page gave it: the lowest sequence is
// the first record's; a log without records, or of another instance than
// the records', is kept as it is.
func TestFirstPageLog(t *testing.T) {
	rec := func(instance string, seq uint64) *sandboxstatsv1.EndedActivation {
		return &sandboxstatsv1.EndedActivation{InstanceId: instance, Sequence: seq}
	}
	last := &sandboxstatsv1.EndedLog{InstanceId: "i1", LowestSequence: 9, NextSequence: 12, EvictedMax: 3}
	for _, tc := range []struct {
		name   string
		log    *sandboxstatsv1.EndedLog
		ended  []*sandboxstatsv1.EndedActivation
		lowest uint64
	}{
		{"pages", last, []*sandboxstatsv1.EndedActivation{rec("i1", 4), rec("i1", 9)}, 4},
		{"no record", last, nil, 9},
		{"another instance", last, []*sandboxstatsv1.EndedActivation{rec("i0", 4)}, 9},
		{"no log", nil, []*sandboxstatsv1.EndedActivation{rec("i1", 4)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := firstPageLog(tc.log, tc.ended)
			if got.GetLowestSequence() != tc.lowest || got.GetNextSequence() != tc.log.GetNextSequence() || got.GetEvictedMax() != tc.log.GetEvictedMax() {
				t.Errorf("got %v, want lowest %d and the rest of %v", got, tc.lowest, tc.log)
			}
		})
	}
	if last.GetLowestSequence() != 9 {
		t.Error("the last page's log was modified")
	}
}

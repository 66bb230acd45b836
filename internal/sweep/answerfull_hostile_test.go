package sweep

// Hostile daemons against the ANSWER_FULL reads (a review of s6's
// change): every read bounded in bytes, time and count.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// probeDaemon is a daemon whose StatsWorkload and ListEndedActivations
// answers a test writes; it counts the calls.
type probeDaemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	active   *sandboxstatsv1.StatsActiveWorkloadsResponse
	workload func(ctx context.Context, uid string) (*sandboxstatsv1.StatsWorkloadResponse, error)
	ended    func(ctx context.Context, token string) (*sandboxstatsv1.ListEndedActivationsResponse, error)
	calls    atomic.Int64
	sent     atomic.Int64
	inflight atomic.Int64
	maxIn    atomic.Int64
	endedN   atomic.Int64
}

func (d *probeDaemon) StatsActiveWorkloads(context.Context, *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	return d.active, nil
}

func (d *probeDaemon) StatsWorkload(ctx context.Context, req *sandboxstatsv1.StatsWorkloadRequest) (*sandboxstatsv1.StatsWorkloadResponse, error) {
	d.calls.Add(1)
	n := d.inflight.Add(1)
	defer d.inflight.Add(-1)
	for {
		m := d.maxIn.Load()
		if n <= m || d.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	r, err := d.workload(ctx, req.GetActorUid())
	if r != nil {
		d.sent.Add(int64(proto.Size(r)))
	}
	return r, err
}

func (d *probeDaemon) ListEndedActivations(ctx context.Context, req *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	d.endedN.Add(1)
	if d.ended == nil {
		return &sandboxstatsv1.ListEndedActivationsResponse{}, nil
	}
	return d.ended(ctx, req.GetPageToken())
}

func (d *probeDaemon) ListDriftFindings(context.Context, *sandboxstatsv1.ListDriftFindingsRequest) (*sandboxstatsv1.ListDriftFindingsResponse, error) {
	return &sandboxstatsv1.ListDriftFindingsResponse{}, nil
}

func startProbe(t *testing.T, d *probeDaemon) string {
	t.Helper()
	return serveDaemon(t, d, grpc.MaxSendMsgSize(8<<20))
}

func fullPending(uids ...string) []*sandboxstatsv1.PendingWorkload {
	var out []*sandboxstatsv1.PendingWorkload
	for _, u := range uids {
		out = append(out, &sandboxstatsv1.PendingWorkload{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: u},
			Reason: sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL, Detail: "cut"})
	}
	return out
}

// TestAnswerFullReplyBound: a daemon that answers each of 64 ANSWER_FULL
// reads with a sample of about 1 MiB: gRPC refuses each above the read's
// share (maxAnswerFullReply) before it is held; nothing is kept, every
// workload stays pending with the reason, and the poll's heap stays small
// (a review measured 72 MiB held before the bound).
func TestAnswerFullReplyBound(t *testing.T) {
	var uids []string
	for i := range 64 {
		uids = append(uids, fmt.Sprintf("u%02d", i))
	}
	big := strings.Repeat("x", (1<<20)-4096)
	d := &probeDaemon{active: &sandboxstatsv1.StatsActiveWorkloadsResponse{Pending: fullPending(uids...)}}
	d.workload = func(_ context.Context, uid string) (*sandboxstatsv1.StatsWorkloadResponse, error) {
		s := sample(uid, 1, 1)
		s.SourceDetail = big
		return &sandboxstatsv1.StatsWorkloadResponse{Sample: s}, nil
	}
	socket := startProbe(t, d)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	})
	r := Config{Concurrency: 1, Timeout: 30 * time.Second}.PollAll(context.Background(), []string{socket})[0]
	close(stop)
	wg.Wait()
	held := float64(peak.Load()-min(base, peak.Load())) / (1 << 20)
	t.Logf("status %s, %d samples, %d pending, capped %v; %d calls; peak heap above base %.1f MiB", r.Status, len(r.Samples), len(r.Pending), r.Capped, d.calls.Load(), held)
	if len(r.Samples) != 0 || len(r.Pending) != 64 {
		t.Errorf("%d samples, %d pending: want none kept, all 64 pending", len(r.Samples), len(r.Pending))
	}
	if held > 24 {
		t.Errorf("the poll held %.1f MiB over its base", held)
	}
	if len(r.Pending) > 0 && !strings.Contains(r.Pending[0].GetDetail(), "read on its own") {
		t.Errorf("pending detail %q does not say why", r.Pending[0].GetDetail())
	}
}

// TestAnswerFullRepeats: an id listed 60 times, and one sampled already,
// are read once and none again.
func TestAnswerFullRepeats(t *testing.T) {
	var uids []string
	for range 60 {
		uids = append(uids, "victim")
	}
	uids = append(uids, "a")
	d := &probeDaemon{active: &sandboxstatsv1.StatsActiveWorkloadsResponse{
		Samples: []*sandboxstatsv1.WorkloadStatsSample{sample("a", 1, 1)}, Pending: fullPending(uids...)}}
	d.workload = func(_ context.Context, uid string) (*sandboxstatsv1.StatsWorkloadResponse, error) {
		return &sandboxstatsv1.StatsWorkloadResponse{Sample: sample(uid, 1, 1)}, nil
	}
	socket := startProbe(t, d)
	r := Config{Concurrency: 1, Timeout: 10 * time.Second}.PollAll(context.Background(), []string{socket})[0]
	count := map[string]int{}
	for _, s := range r.Samples {
		count[s.GetActorUid()]++
	}
	if d.calls.Load() != 1 || count["victim"] != 1 || count["a"] != 1 {
		t.Errorf("%d calls, samples by actor %v: want one call, each actor once", d.calls.Load(), count)
	}
}

// TestAnswerFullKeepsTimeForEnded: slow ANSWER_FULL reads (statsd's 2 s
// read timeout against the agent's 10 s, scaled) leave the ended pages
// their share of the poll.
func TestAnswerFullKeepsTimeForEnded(t *testing.T) {
	var uids []string
	for i := range 24 {
		uids = append(uids, fmt.Sprintf("u%02d", i))
	}
	rec := func(u string) *sandboxstatsv1.EndedActivation {
		return &sandboxstatsv1.EndedActivation{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: u}, EpochUnixNano: 1, EndUnixNano: 2}
	}
	d := &probeDaemon{active: &sandboxstatsv1.StatsActiveWorkloadsResponse{
		Samples: []*sandboxstatsv1.WorkloadStatsSample{sample("ok", 1, 1)}, Pending: fullPending(uids...),
		Ended: []*sandboxstatsv1.EndedActivation{rec("e0")}, EndedNextPageToken: "t1"}}
	d.workload = func(ctx context.Context, uid string) (*sandboxstatsv1.StatsWorkloadResponse, error) {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &sandboxstatsv1.StatsWorkloadResponse{Sample: sample(uid, 1, 1)}, nil
	}
	d.ended = func(context.Context, string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
		return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{rec("e1")}}, nil
	}
	socket := startProbe(t, d)
	r := Config{Concurrency: 1, Timeout: time.Second}.PollAll(context.Background(), []string{socket})[0]
	if d.endedN.Load() == 0 || len(r.Ended) != 2 || r.EndedErr != nil {
		t.Errorf("ended %d (err %v), %d ListEndedActivations calls: want both pages read", len(r.Ended), r.EndedErr, d.endedN.Load())
	}
	if len(r.Samples) < 2 {
		t.Errorf("%d samples: want some of the slow reads kept", len(r.Samples))
	}
}

// TestAnswerFullDetails: a long daemon detail does not push the read's
// error out; an answer without a sample is named as such.
func TestAnswerFullDetails(t *testing.T) {
	p := fullPending("long", "nil")
	p[0].Detail = strings.Repeat("d", 2000)
	d := &probeDaemon{active: &sandboxstatsv1.StatsActiveWorkloadsResponse{
		Samples: []*sandboxstatsv1.WorkloadStatsSample{sample("ok", 1, 1)}, Pending: p}}
	d.workload = func(_ context.Context, uid string) (*sandboxstatsv1.StatsWorkloadResponse, error) {
		if uid == "long" {
			return nil, fmt.Errorf("boom\x1b[31m")
		}
		return &sandboxstatsv1.StatsWorkloadResponse{}, nil
	}
	socket := startProbe(t, d)
	r := Config{Concurrency: 1, Timeout: 10 * time.Second}.PollAll(context.Background(), []string{socket})[0]
	got := map[string]string{}
	for _, p := range r.Pending {
		got[p.GetIdentity().GetActorUid()] = p.GetDetail()
	}
	if d := got["long"]; !strings.Contains(d, "boom") || strings.Contains(d, "\x1b") || len(d) > maxPendingDetail+64 {
		t.Errorf("long: %d bytes, ends %q", len(d), d[max(0, len(d)-120):])
	}
	if d := got["nil"]; !strings.Contains(d, "answered no sample") {
		t.Errorf("nil: %q", d)
	}
}

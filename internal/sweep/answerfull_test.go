package sweep

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// v1Source answers what a real v1 cgroup of a pod bound by cgroup path
// does (statsd's reading of the bench's cgroups, word for word): a sample
// of about 1.1 KiB, most of it the absent list.
type v1Source struct{ path string }

func (s v1Source) Sample(context.Context) (source.Reading, error) {
	cpu, procs := uint64(1234), uint32(1)
	return source.Reading{Kind: source.KindCgroup, MemoryCurrentBytes: 200 << 10, MemoryWorkingSetBytes: 200 << 10, CPUUsageUsec: &cpu, SandboxProcesses: &procs,
		Detail: fmt.Sprintf("cgroup v1 (hybrid) memory /sys/fs/cgroup/memory%s, cpuacct /sys/fs/cgroup/cpuacct%s", s.path, s.path),
		Absent: []source.Absent{
			{Field: "memory_signals.high_bytes", Reason: "cgroup v1 has no memory.high"},
			{Field: "memory_signals.oom_group_kills", Reason: "cgroup v1 has no memory.events"},
			{Field: "memory_signals.oom_events", Reason: "cgroup v1 has no memory.events"},
			{Field: "memory_signals.max_events", Reason: "cgroup v1 has no memory.events"},
			{Field: "pressure", Reason: "no cgroup /sys/fs/cgroup/unified" + s.path},
			{Field: "block_io", Reason: "cgroup v1 blk-throttle counts IO only on block devices for which some cgroup has set a throttle rule " +
				"(blkio.throttle.{read,write}_bps_device or _iops_device): with none set its counters stay 0 whatever the IO, so 0 would claim " +
				"no IO; and blkio.io_service_bytes (CFQ/BFQ) is empty under this kernel's scheduler (none or mq-deadline)"},
			{Field: "network", Reason: "bound by cgroup path: no sentry pid, so no network namespace to read (bind by sentry pid for network counters)"},
		}}, nil
}
func (v1Source) Close() error { return nil }

// startFullDaemon is statsd's read service on a Unix socket with n
// workloads bound, each a v1Source; fail, when set, answers StatsWorkload
// for it instead of statsd.
func startFullDaemon(t *testing.T, n int, fail error) (socket string, actors []string) {
	t.Helper()
	store, err := identity.NewStore(identity.Config{
		Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			return v1Source{ref.CgroupPath}, nil, nil
		},
		MaxWorkloads: identity.LimitMaxWorkloads,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	for i := range n {
		id := identity.Identity{ActorUID: fmt.Sprintf("peer-uid-%03d", i), ActorName: fmt.Sprintf("pod-%03d", i), ActorNamespace: fmt.Sprintf("ns-%d", i%16)}
		ref := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: fmt.Sprintf("/sbs-peer-4242-64-1/pod-%03d", i)}
		if _, _, err := store.Bind(context.Background(), identity.OpRun, id, ref); err != nil {
			t.Fatal(err)
		}
		actors = append(actors, id.ActorUID)
	}
	socket = serveDaemon(t, server.NewStatsService(store, nil, nil), grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if fail != nil && strings.HasSuffix(info.FullMethod, "/StatsWorkload") {
			return nil, fail
		}
		return h(ctx, req)
	}))
	return socket, actors
}

func sampleActors(samples []*sandboxstatsv1.WorkloadStatsSample) []string {
	var out []string
	for _, s := range samples {
		out = append(out, s.GetActorUid())
	}
	return out
}

// TestPollReadsWorkloadsTheAnswerHadNoRoomFor: at statsd's ceiling (64
// workloads, --max-workloads 64) of real v1 cgroups, the discovery answer
// holds about 41 samples and lists the rest as pending ANSWER_FULL ("read
// it with StatsWorkload"); a poll (Config's and a Pool's) reads those on
// their own and returns a sample of every workload, sorted, none pending.
// When those reads fail, the entries stay pending, the failure named.
func TestPollReadsWorkloadsTheAnswerHadNoRoomFor(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Concurrency: 1, Timeout: 10 * time.Second}
	polls := map[string]func(socket string) DaemonResult{
		"config": func(socket string) DaemonResult { return cfg.PollAll(ctx, []string{socket})[0] },
		"pool": func(socket string) DaemonResult {
			p := cfg.NewPool()
			defer p.Close()
			return p.PollAll(ctx, []string{socket})[0]
		},
	}
	t.Run("read", func(t *testing.T) {
		socket, actors := startFullDaemon(t, identity.LimitMaxWorkloads, nil)
		// The answer itself leaves some out: what this test is about.
		answered, _ := answerFull(t, socket)
		if len(answered) == 0 {
			t.Fatal("the discovery answer holds all 64 samples: no ANSWER_FULL to read")
		}
		for name, poll := range polls {
			r := poll(socket)
			if r.Status != StatusOK || len(r.Pending) != 0 || len(r.Capped) != 0 {
				t.Fatalf("%s: status %s, %d samples, pending %v, capped %v", name, r.Status, len(r.Samples), r.Pending, r.Capped)
			}
			if diff := cmp.Diff(actors, sampleActors(r.Samples)); diff != "" {
				t.Errorf("%s: samples (-bound +polled):\n%s", name, diff)
			}
			t.Logf("%s: %d samples, %d of them read on their own (ANSWER_FULL)", name, len(r.Samples), len(answered))
		}
	})
	t.Run("reads fail", func(t *testing.T) {
		socket, _ := startFullDaemon(t, identity.LimitMaxWorkloads, status.Error(codes.Unavailable, "no"))
		answered, _ := answerFull(t, socket)
		for name, poll := range polls {
			r := poll(socket)
			if r.Status != StatusOK || len(r.Samples)+len(r.Pending) != identity.LimitMaxWorkloads {
				t.Fatalf("%s: status %s, %d samples, %d pending", name, r.Status, len(r.Samples), len(r.Pending))
			}
			var pending []string
			for _, p := range r.Pending {
				if p.GetReason() != sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL || !strings.Contains(p.GetDetail(), "; read on its own: ") {
					t.Errorf("%s: pending %v", name, p)
				}
				pending = append(pending, p.GetIdentity().GetActorUid())
			}
			if diff := cmp.Diff(answered, pending); diff != "" {
				t.Errorf("%s: pending (-answer's +polled):\n%s", name, diff)
			}
		}
	})
}

// TestPollAnswerFullWithinReplyBytes: the reads of the ANSWER_FULL
// workloads stay, with the answer, within Limits.MaxReplyBytes; those over
// it stay pending, the cap named ("reply-bytes").
func TestPollAnswerFullWithinReplyBytes(t *testing.T) {
	socket, _ := startFullDaemon(t, identity.LimitMaxWorkloads, nil)
	answered, size := answerFull(t, socket)
	// Room for three samples of about 1.1 KiB, not a fourth.
	cfg := Config{Concurrency: 1, Timeout: 10 * time.Second, Limits: Limits{MaxReplyBytes: size + 3*1200}}
	r := cfg.PollAll(context.Background(), []string{socket})[0]
	if r.Status != StatusOK || len(r.Samples)+len(r.Pending) != identity.LimitMaxWorkloads || !slices.Contains(r.Capped, "reply-bytes") {
		t.Fatalf("status %s, %d samples, %d pending, capped %v", r.Status, len(r.Samples), len(r.Pending), r.Capped)
	}
	if read := len(answered) - len(r.Pending); read != 3 {
		t.Errorf("%d of the %d ANSWER_FULL workloads read within %d bytes, want 3", read, len(answered), cfg.Limits.MaxReplyBytes)
	}
	for _, p := range r.Pending {
		if !strings.Contains(p.GetDetail(), "; read on its own: over the poll's") {
			t.Errorf("pending %v", p)
		}
	}
}

// answerFull is the actors a discovery answer of the daemon at socket
// lists as pending ANSWER_FULL, sorted, and the answer's size.
func answerFull(t *testing.T, socket string) ([]string, int) {
	t.Helper()
	dc, err := Config{}.poller().dial(socket, socketFile{})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.cc.Close()
	resp, err := dc.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range resp.GetPending() {
		if p.GetReason() == sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL {
			out = append(out, p.GetIdentity().GetActorUid())
		}
	}
	slices.Sort(out)
	t.Logf("discovery answer: %d samples, %d pending ANSWER_FULL, %d bytes", len(resp.GetSamples()), len(out), proto.Size(resp))
	return out, proto.Size(resp)
}

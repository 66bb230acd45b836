package sweep

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// busyDaemon refuses its first refuse discovery reads (all of them when
// refuse is negative) RESOURCE_EXHAUSTED TOO_MANY_READS, as statsd does in
// a reader's storm, then answers resp; it has one drift finding and one
// ended record to list.
type busyDaemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	refuse                   int32
	resp                     *sandboxstatsv1.StatsActiveWorkloadsResponse
	calls, driftCalls, ended atomic.Int32
}

func (d *busyDaemon) StatsActiveWorkloads(context.Context, *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	if n := d.calls.Add(1); d.refuse < 0 || n <= d.refuse {
		return nil, statsdfake.Status(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS, "64 reads are in flight")
	}
	return d.resp, nil
}

func (d *busyDaemon) ListDriftFindings(context.Context, *sandboxstatsv1.ListDriftFindingsRequest) (*sandboxstatsv1.ListDriftFindingsResponse, error) {
	d.driftCalls.Add(1)
	return &sandboxstatsv1.ListDriftFindingsResponse{Findings: []*sandboxstatsv1.DriftFinding{{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, ActorUid: "a"}}}, nil
}

func (d *busyDaemon) ListEndedActivations(context.Context, *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	d.ended.Add(1)
	return &sandboxstatsv1.ListEndedActivationsResponse{Ended: []*sandboxstatsv1.EndedActivation{ended(1, 0)}}, nil
}

func startBusyDaemon(t *testing.T, d *busyDaemon) string {
	t.Helper()
	return serveDaemon(t, d)
}

// serveDaemon serves d on a Unix socket of its own until the test ends and
// returns the socket's path.
func serveDaemon(t *testing.T, d sandboxstatsv1.WorkloadStatsServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "daemon.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, d)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return socket
}

// TestPollTooManyReads: a daemon refusing a read TOO_MANY_READS (statsd in
// a reader's storm) is busy, not hostile: the poll is not counted as an
// answer over its cap (replies_capped_total{part="reply-bytes"}, the
// hostile-daemon alarm), it is asked again once after a short pause, and,
// refused again, it is a poll error (ResourceExhausted, TOO_MANY_READS)
// whose drift findings and ended activations are still listed. An answer
// over the reply cap (gRPC's own ResourceExhausted, no ErrorInfo) is still
// capped and asked nothing more.
func TestPollTooManyReads(t *testing.T) {
	ctx := context.Background()
	answer := &sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: []*sandboxstatsv1.WorkloadStatsSample{sample("a", 1, 1)}}

	t.Run("refused once", func(t *testing.T) {
		d := &busyDaemon{refuse: 1, resp: answer}
		r := PollAll(ctx, []string{startBusyDaemon(t, d)}, 1, 5*time.Second)[0]
		if r.Status != StatusOK || len(r.Samples) != 1 || len(r.Capped) != 0 || d.calls.Load() != 2 {
			t.Errorf("status %s (%v), %d samples, capped %v after %d calls; want ok, 1 sample, nothing capped after 2 calls", r.Status, r.Err, len(r.Samples), r.Capped, d.calls.Load())
		}
	})
	t.Run("refused always", func(t *testing.T) {
		d := &busyDaemon{refuse: -1, resp: answer}
		r := PollAll(ctx, []string{startBusyDaemon(t, d)}, 1, 5*time.Second)[0]
		if r.Status != StatusError || r.Code != codes.ResourceExhausted || api.ReasonOf(r.Err) != "TOO_MANY_READS" {
			t.Errorf("status %s code %s reason %q (%v); want an error, ResourceExhausted, TOO_MANY_READS", r.Status, r.Code, api.ReasonOf(r.Err), r.Err)
		}
		if diff := cmp.Diff([]string(nil), r.Capped); diff != "" {
			t.Errorf("capped (-want +got):\n%s", diff)
		}
		if got := d.calls.Load(); got != 2 {
			t.Errorf("%d discovery reads, want 2 (one retry)", got)
		}
		if len(r.Ended) != 1 || r.EndedErr != nil || len(r.DriftFindings) != 1 || r.DriftErr != nil {
			t.Errorf("ended %d (%v), drift findings %d (%v); want 1 each, listed despite the refusal", len(r.Ended), r.EndedErr, len(r.DriftFindings), r.DriftErr)
		}
	})
	t.Run("over the reply cap", func(t *testing.T) {
		big := sample("a", 1, 1)
		big.ActorName = strings.Repeat("n", 128<<10)
		d := &busyDaemon{resp: &sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: []*sandboxstatsv1.WorkloadStatsSample{big}}}
		c := Config{Concurrency: 1, Timeout: 5 * time.Second, Limits: Limits{MaxReplyBytes: 64 << 10}}
		r := c.PollAll(ctx, []string{startBusyDaemon(t, d)})[0]
		if r.Status != StatusError || r.Code != codes.ResourceExhausted || d.calls.Load() != 1 || d.ended.Load() != 0 || d.driftCalls.Load() != 0 {
			t.Errorf("status %s code %s after %d calls, %d ended and %d drift lists; want an error, ResourceExhausted, after 1 call and nothing more asked",
				r.Status, r.Code, d.calls.Load(), d.ended.Load(), d.driftCalls.Load())
		}
		if diff := cmp.Diff([]string{"reply-bytes"}, r.Capped); diff != "" {
			t.Errorf("capped (-want +got):\n%s", diff)
		}
	})
}

// TestPoolKeepsBusyDaemonsConnection: a daemon refusing reads
// TOO_MANY_READS keeps its connection in a Pool (the connection is sound;
// dialing again in a storm would compete for the daemon's
// --max-read-connections with the reader storming it).
func TestPoolKeepsBusyDaemonsConnection(t *testing.T) {
	d := &busyDaemon{refuse: -1}
	socket := startBusyDaemon(t, d)
	p := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer p.Close()
	if r := pollOne(t, p, socket); r.Status != StatusError || r.Code != codes.ResourceExhausted {
		t.Fatalf("poll: %s %s %v; want an error, ResourceExhausted", r.Status, r.Code, r.Err)
	}
	if kept(t, p, socket) == nil {
		t.Errorf("the connection to a busy daemon was dropped")
	}
}

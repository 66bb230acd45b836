// Package statsdfake provides fake statsd daemons on real Unix sockets
// (real gRPC servers) that can be made to hang (never answer until the
// caller gives up) or be killed (listener closed, socket removed): Daemon,
// for tests of the node agent and statsctl, implements
// WorkloadStatsService.StatsActiveWorkloads with scripted answers;
// Lifecycle, for tests of a launcher (the NRI bridge), keeps bindings as
// statsd's WorkloadLifecycleService does and lists them.
package statsdfake

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Daemon is a fake statsd serving WorkloadStatsService on a Unix socket.
type Daemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer

	// Socket is the path the daemon listens on.
	Socket string

	srv   *grpc.Server
	calls atomic.Int64

	mu     sync.Mutex
	resp   *sandboxstatsv1.StatsActiveWorkloadsResponse
	err    error
	hang   bool
	killed bool
	drift  []*sandboxstatsv1.DriftFinding
}

var _ sandboxstatsv1.WorkloadStatsServiceServer = (*Daemon)(nil)

// Start serves a Daemon on socket until the test ends. It answers "no
// workload" until told otherwise.
func Start(tb testing.TB, socket string) *Daemon {
	tb.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		tb.Fatalf("statsdfake: listen %s: %v", socket, err)
	}
	return Serve(tb, ln, socket)
}

// Serve serves a Daemon on ln (whose socket file is socket) until the test
// ends, as Start does.
func Serve(tb testing.TB, ln net.Listener, socket string) *Daemon {
	tb.Helper()
	d := &Daemon{Socket: socket, srv: grpc.NewServer()}
	d.SetNoSample(sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD, "")
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(d.srv, d)
	go func() { _ = d.srv.Serve(ln) }()
	tb.Cleanup(d.Kill)
	return d
}

// Set makes the daemon answer with these samples. A sample whose
// observed_at_unix_nano is 0 gets the time of the call.
func (d *Daemon) Set(samples ...*sandboxstatsv1.WorkloadStatsSample) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resp = &sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: samples}
	d.err, d.hang = nil, false
}

// SetResponse makes the daemon answer with resp as it is (samples, ended
// activations, no-sample reason).
func (d *Daemon) SetResponse(resp *sandboxstatsv1.StatsActiveWorkloadsResponse) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resp = resp
	d.err, d.hang = nil, false
}

// SetNoSample makes the daemon answer with no sample and this reason.
func (d *Daemon) SetNoSample(reason sandboxstatsv1.NoSampleReason, detail string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resp = &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: reason, NoSampleDetail: detail}
	d.err, d.hang = nil, false
}

// SetError makes the daemon fail every call with err (a status error).
func (d *Daemon) SetError(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err, d.hang = err, false
}

// Hang makes every call block until its caller gives up.
func (d *Daemon) Hang() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hang = true
}

// Kill stops the daemon as a crash would look to a poller: the listener is
// closed, connections are dropped and the socket file is removed.
func (d *Daemon) Kill() {
	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	d.killed = true
	d.mu.Unlock()
	d.srv.Stop()
	_ = os.Remove(d.Socket)
}

// SetDrift makes ListDriftFindings answer with these open findings.
func (d *Daemon) SetDrift(findings ...*sandboxstatsv1.DriftFinding) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.drift = findings
}

// ListDriftFindings answers as scripted by SetDrift.
func (d *Daemon) ListDriftFindings(context.Context, *sandboxstatsv1.ListDriftFindingsRequest) (*sandboxstatsv1.ListDriftFindingsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &sandboxstatsv1.ListDriftFindingsResponse{Findings: d.drift, Status: &sandboxstatsv1.DriftCheckStatus{Enabled: true}}, nil
}

// Calls returns how many StatsActiveWorkloads calls arrived.
func (d *Daemon) Calls() int64 { return d.calls.Load() }

// StatsActiveWorkloads answers as scripted.
func (d *Daemon) StatsActiveWorkloads(ctx context.Context, _ *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	d.calls.Add(1)
	d.mu.Lock()
	resp, err, hang := d.resp, d.err, d.hang
	d.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	out := proto.Clone(resp).(*sandboxstatsv1.StatsActiveWorkloadsResponse)
	now := time.Now().UnixNano()
	for _, s := range out.Samples {
		if s.ObservedAtUnixNano == 0 {
			s.ObservedAtUnixNano = now
		}
	}
	return out, nil
}

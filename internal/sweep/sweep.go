package sweep

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Status is the outcome of polling one daemon.
type Status string

const (
	// StatusOK: the daemon answered with at least one sample.
	StatusOK Status = "ok"
	// StatusNoSample: the daemon answered with no sample (idle, or its
	// workload not measurable yet); NoSampleReason says which.
	StatusNoSample Status = "no-sample"
	// StatusVanished: the socket was gone by the time it was polled (the
	// daemon exited); skipped, not an error.
	StatusVanished Status = "vanished"
	// StatusError: the call failed; Code and Err say how.
	StatusError Status = "error"
)

// DaemonResult is what one daemon answered in one sweep.
type DaemonResult struct {
	// Socket is the daemon's Unix socket path, as found by the glob.
	Socket string
	Status Status
	// Samples as the daemon returned them (StatusOK).
	Samples []*sandboxstatsv1.WorkloadStatsSample
	// NoSampleReason and NoSampleDetail explain StatusNoSample.
	NoSampleReason sandboxstatsv1.NoSampleReason
	NoSampleDetail string
	// Code is the gRPC code of a failed call (StatusError, StatusVanished).
	Code codes.Code
	// Err is the failure (StatusError, StatusVanished), naming the socket.
	Err error
	// Took is the wall time of the poll, dial included.
	Took time.Duration
	// DriftFindings are the daemon's open drift findings, fetched with a
	// second call (ListDriftFindings) on the same connection, within the
	// same per-call deadline, when a sample says it has some, and when the
	// daemon produced no sample for a reason drift may explain: it answered
	// NOT_MEASURABLE_YET, or the call failed DeadlineExceeded or Internal
	// (not for NO_WORKLOAD, a vanished daemon or a refused connection).
	DriftFindings []*sandboxstatsv1.DriftFinding
	// DriftErr is why that second call failed or was not made (out of
	// time); the samples still count.
	DriftErr error
	// Ended are the activations that ended at the daemon recently, as
	// StatsActiveWorkloads returned them or, when that call failed (a hung
	// or failing read of the current workload), as ListEndedActivations
	// returned them within what was left of the deadline.
	Ended []*sandboxstatsv1.EndedActivation
	// EndedErr is why that ListEndedActivations failed.
	EndedErr error
}

// Discover returns the sockets matching glob, sorted. It keeps only Unix
// sockets; a glob that matches nothing is not an error.
func Discover(glob string) ([]string, error) {
	paths, err := filepath.Glob(glob)
	if err != nil {
		return nil, fmt.Errorf("sweep: socket glob %q: %w", glob, err)
	}
	out := paths[:0]
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Type() != fs.ModeSocket {
			continue // vanished since the glob, or not a socket
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

// Sweep discovers the daemons matching glob and polls each once with
// StatsActiveWorkloads, at most concurrency at a time (at least 1), each
// call under its own perCallTimeout. It returns one result per socket,
// sorted by socket path; the error is only for a malformed glob. A hung
// daemon costs its own timeout and holds one of the concurrency slots
// meanwhile; the others proceed.
func Sweep(ctx context.Context, glob string, concurrency int, perCallTimeout time.Duration) ([]DaemonResult, error) {
	sockets, err := Discover(glob)
	if err != nil {
		return nil, err
	}
	return PollAll(ctx, sockets, concurrency, perCallTimeout), nil
}

// PollAll polls the given sockets as Sweep does.
func PollAll(ctx context.Context, sockets []string, concurrency int, perCallTimeout time.Duration) []DaemonResult {
	results := make([]DaemonResult, len(sockets))
	var g errgroup.Group
	g.SetLimit(max(concurrency, 1))
	for i, sock := range sockets {
		g.Go(func() error {
			results[i] = pollDaemon(ctx, sock, perCallTimeout)
			return nil
		})
	}
	_ = g.Wait() // the goroutines never fail: errors are in the results
	return results
}

// pollDaemon calls StatsActiveWorkloads once on the daemon at socket, with a
// fresh connection closed afterwards, under timeout (0: only ctx bounds it).
func pollDaemon(ctx context.Context, socket string, timeout time.Duration) DaemonResult {
	start := time.Now()
	r := poll(ctx, socket, timeout)
	r.Socket = socket
	r.Took = time.Since(start)
	return r
}

func poll(ctx context.Context, socket string, timeout time.Duration) DaemonResult {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	abs, err := filepath.Abs(socket) // "unix://" needs an absolute path
	if err != nil {
		return failed(socket, err)
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return failed(socket, err)
	}
	defer conn.Close()
	client := sandboxstatsv1.NewWorkloadStatsServiceClient(conn)
	resp, err := client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		r := failed(socket, err)
		// A workload whose reads time out or fail produces no sample, but
		// drift (a dead sandbox, a silent agent) may say why.
		if r.Status == StatusError && (r.Code == codes.DeadlineExceeded || r.Code == codes.Internal) {
			listDrift(ctx, client, socket, &r)
		}
		if r.Status == StatusError && r.Code != codes.Unavailable {
			listEnded(ctx, client, socket, &r)
		}
		return r
	}
	if len(resp.GetSamples()) == 0 {
		r := DaemonResult{
			Status:         StatusNoSample,
			NoSampleReason: resp.GetNoSampleReason(),
			NoSampleDetail: resp.GetNoSampleDetail(),
			Ended:          resp.GetEnded(),
		}
		if r.NoSampleReason == sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET {
			listDrift(ctx, client, socket, &r)
		}
		return r
	}
	r := DaemonResult{Status: StatusOK, Samples: resp.GetSamples(), Ended: resp.GetEnded()}
	if slices.ContainsFunc(r.Samples, func(s *sandboxstatsv1.WorkloadStatsSample) bool { return s.GetOpenDriftFindings() > 0 }) {
		listDrift(ctx, client, socket, &r)
	}
	return r
}

// listDrift fills r's DriftFindings (or DriftErr) with ListDriftFindings,
// under what is left of ctx (the poll's per-call deadline).
func listDrift(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, socket string, r *DaemonResult) {
	if err := ctx.Err(); err != nil {
		r.DriftErr = fmt.Errorf("sweep: list drift findings %s: no time left: %w", socket, err)
		return
	}
	drift, err := client.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
	if err != nil {
		r.DriftErr = fmt.Errorf("sweep: list drift findings %s: %w", socket, err)
		return
	}
	r.DriftFindings = drift.GetFindings()
}

// listEnded fills r's Ended (or EndedErr) with ListEndedActivations, under
// what is left of ctx: a daemon whose current workload cannot be read still
// hands over the activations that ended there.
func listEnded(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, socket string, r *DaemonResult) {
	if err := ctx.Err(); err != nil {
		r.EndedErr = fmt.Errorf("sweep: list ended activations %s: no time left: %w", socket, err)
		return
	}
	resp, err := client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
	if err != nil {
		r.EndedErr = fmt.Errorf("sweep: list ended activations %s: %w", socket, err)
		return
	}
	r.Ended = resp.GetEnded()
}

// failed classifies a failed poll. A socket that no longer exists after the
// call failed is a daemon that went away: vanished, not an error.
func failed(socket string, err error) DaemonResult {
	code := status.Code(err)
	r := DaemonResult{Status: StatusError, Code: code, Err: fmt.Errorf("sweep: poll %s: %w", socket, err)}
	if code == codes.Unavailable {
		if _, serr := os.Lstat(socket); errors.Is(serr, fs.ErrNotExist) {
			r.Status = StatusVanished
		}
	}
	return r
}

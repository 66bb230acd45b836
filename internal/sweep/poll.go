package sweep

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/peercred"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// grpcFrameHeader is the length-prefixed message header gRPC puts before
// each message (a flag byte and a 4-byte length).
const grpcFrameHeader = 5

// poller polls one daemon at a time under a Config's rules.
type poller struct {
	limits  Limits
	allow   map[uint32]bool
	timeout time.Duration
}

func (c Config) poller() poller {
	return poller{limits: c.Limits.orDefault(), allow: uidSet(c.AllowUIDs), timeout: c.Timeout}
}

// daemonConn is a gRPC connection to one daemon's socket.
type daemonConn struct {
	// id is the socket file it was made for (Pool).
	id     socketFile
	cc     *grpc.ClientConn
	client sandboxstatsv1.WorkloadStatsServiceClient
	// refused is set when a dial was refused: the server's uid is not
	// allowed. A connection once refused is not kept.
	refused atomic.Pointer[error]
}

// pollDaemon polls the daemon at socket with poll under p.timeout (0: only
// ctx bounds it), dial included, and times it.
func (p poller) pollDaemon(ctx context.Context, socket string, poll func(context.Context, string) DaemonResult) DaemonResult {
	start := time.Now()
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	r := poll(ctx, socket)
	r.Socket = socket
	r.Took = time.Since(start)
	return r
}

// dialer connects to socket and checks the server's credentials before
// gRPC says a word, for every connection the ClientConn makes (the first
// and each reconnect): a server whose uid is not allowed (an impostor
// behind a socket file it could not own) is refused, and refused is set.
func (p poller) dialer(socket string, refused *atomic.Pointer[error]) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, err
		}
		uid, _, err := peercred.PeerUID(conn)
		if err == nil && !p.allow[uid] {
			err = fmt.Errorf("the server runs as uid %d, not an allowed uid", uid)
		}
		if err != nil {
			conn.Close()
			err = fmt.Errorf("sweep: refused %s: %w", socket, err)
			refused.Store(&err)
			return nil, err
		}
		return conn, nil
	}
}

// dial returns a connection to the socket at the absolute path abs, whose
// file is id. It connects at its first call.
//
// Its flow-control windows are fixed, as large as the largest reply
// accepted (at least HTTP/2's 64 KiB): a fixed window turns off gRPC's
// bandwidth estimation, which otherwise pings the daemon with each reply (a
// round trip more per poll, for windows a bounded reply never needs).
func (p poller) dial(abs string, id socketFile) (*daemonConn, error) {
	dc := &daemonConn{id: id}
	window := int32(min(max(p.limits.MaxReplyBytes+grpcFrameHeader, 64<<10), math.MaxInt32))
	cc, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(p.dialer(abs, &dc.refused)),
		grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.limits.MaxReplyBytes)))
	if err != nil {
		return nil, err
	}
	dc.cc, dc.client = cc, sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
	return dc, nil
}

// pollOnce polls the daemon at socket on a fresh connection, closed
// afterwards.
func (p poller) pollOnce(ctx context.Context, socket string) DaemonResult {
	abs, err := filepath.Abs(socket) // "unix://" needs an absolute path
	if err != nil {
		return failed(socket, err)
	}
	dc, err := p.dial(abs, socketFile{})
	if err != nil {
		return failed(socket, err)
	}
	defer dc.cc.Close()
	return p.poll(ctx, socket, dc)
}

// poll calls StatsActiveWorkloads on dc, StatsWorkload for each workload
// its answer had no room for (ANSWER_FULL), and ListDriftFindings and
// ListEndedActivations when its answer (or failure) calls for them, all
// under ctx.
func (p poller) poll(ctx context.Context, socket string, dc *daemonConn) DaemonResult {
	client := dc.client
	resp, err := client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if tooManyReads(err) && pause(ctx, busyPause) {
		// statsd is busy (a reader's storm): once more, after a pause.
		resp, err = client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	}
	if err != nil {
		if rerr := dc.refused.Load(); rerr != nil {
			return DaemonResult{Status: StatusError, Code: codes.PermissionDenied, Err: *rerr, PeerRefused: true}
		}
		r := failed(socket, err)
		switch {
		case overReplyCap(err):
			r.Capped = []string{"reply-bytes"}
			return r // an answer over the cap: ask that daemon nothing more
		case r.Status == StatusError && (r.Code == codes.DeadlineExceeded || r.Code == codes.Internal || tooManyReads(err)):
			// A workload whose reads time out or fail produces no sample,
			// but drift (a dead sandbox, a silent agent) may say why; a
			// busy daemon's findings are still its findings.
			p.listDrift(ctx, client, socket, &r)
		}
		if r.Status == StatusError && r.Code != codes.Unavailable {
			p.listEnded(ctx, client, socket, &r)
		}
		return r
	}
	if n := len(resp.GetSamples()); n > p.limits.MaxSamples {
		return DaemonResult{Status: StatusError, Code: codes.ResourceExhausted, Capped: []string{"samples"},
			Err: fmt.Errorf("sweep: poll %s: %d samples, over the cap of %d: answer dropped", socket, n, p.limits.MaxSamples)}
	}
	// The workloads the answer had no room for (ANSWER_FULL), each read on
	// its own: with the answer, within Limits.MaxReplyBytes (the ended
	// pages have their own).
	samples, pending := resp.GetSamples(), resp.GetPending()
	var capped []string
	if len(pending) <= p.limits.MaxSamples {
		samples, pending, capped = p.readAnswerFull(ctx, client, samples, pending, proto.Size(resp))
	}
	var r DaemonResult
	if len(samples) == 0 {
		r = DaemonResult{Status: StatusNoSample, NoSampleReason: resp.GetNoSampleReason(), NoSampleDetail: resp.GetNoSampleDetail()}
		if r.NoSampleReason == sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET {
			p.listDrift(ctx, client, socket, &r)
		}
	} else {
		r = DaemonResult{Status: StatusOK, Samples: samples}
		// A workload without a sample beside the others (its read timed
		// out, its sandbox may be gone): drift may say why, as for a
		// daemon that answered no sample.
		if len(pending) > 0 || slices.ContainsFunc(r.Samples, func(s *sandboxstatsv1.WorkloadStatsSample) bool { return s.GetOpenDriftFindings() > 0 }) {
			p.listDrift(ctx, client, socket, &r)
		}
	}
	r.Pending = pending
	for _, c := range capped {
		if !slices.Contains(r.Capped, c) {
			r.Capped = append(r.Capped, c)
		}
	}
	r.EndedLog = resp.GetEndedLog()
	if len(r.Pending) > p.limits.MaxSamples {
		r.Pending, r.Capped = nil, append(r.Capped, "pending")
	}
	if token := resp.GetEndedNextPageToken(); token != "" {
		ended, err := readEndedPages(ctx, client, p.limits, resp.GetEnded(), token, proto.Size(resp))
		if setEnded(socket, &r, ended, err) {
			dropEndedSamples(&r, ended[len(resp.GetEnded()):])
		}
		return r
	}
	setEnded(socket, &r, resp.GetEnded(), endedCount(resp.GetEnded(), p.limits))
	return r
}

// setEnded sets r's ended activations as read, with err, the error that
// ended the reading (nil once every page was read): a failed call keeps
// the pages read before it (the rest stays at the daemon for the next
// sweep); over a cap they are dropped whole. It reports whether any are set.
func setEnded(socket string, r *DaemonResult, ended []*sandboxstatsv1.EndedActivation, err error) bool {
	switch {
	case errors.Is(err, errEndedCapped):
		r.Capped = append(r.Capped, "ended")
		r.EndedErr = fmt.Errorf("sweep: %s: %w: dropped", socket, err)
		return false
	case err != nil:
		if overReplyCap(err) {
			r.Capped = append(r.Capped, "reply-bytes")
		}
		r.EndedErr = fmt.Errorf("sweep: list ended activations %s: %w", socket, err)
	}
	r.Ended = ended
	return len(ended) > 0
}

// dropEndedSamples drops r's samples of the activations whose records came
// in later pages than the samples: the activation ended between the calls,
// and its record is the later state (an answer is never a sample beside
// its own record). A daemon left with no sample answered none.
func dropEndedSamples(r *DaemonResult, later []*sandboxstatsv1.EndedActivation) {
	if len(later) == 0 || len(r.Samples) == 0 {
		return
	}
	type key struct {
		actor string
		epoch int64
	}
	ended := make(map[key]bool, len(later))
	for _, e := range later {
		ended[key{e.GetIdentity().GetActorUid(), e.GetEpochUnixNano()}] = true
	}
	kept := slices.DeleteFunc(slices.Clone(r.Samples), func(s *sandboxstatsv1.WorkloadStatsSample) bool {
		return ended[key{s.GetActorUid(), s.GetEpochUnixNano()}]
	})
	if len(kept) == len(r.Samples) {
		return
	}
	r.Samples = kept
	if len(kept) == 0 {
		r.Status, r.NoSampleDetail = StatusNoSample, "the sampled activation ended while the ended activations were read: its record is in Ended"
	}
}

// listDrift fills r's DriftFindings (or DriftErr) with ListDriftFindings,
// under what is left of ctx (the poll's per-call deadline).
func (p poller) listDrift(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, socket string, r *DaemonResult) {
	if err := ctx.Err(); err != nil {
		r.DriftErr = fmt.Errorf("sweep: list drift findings %s: no time left: %w", socket, err)
		return
	}
	drift, err := client.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
	if err != nil {
		if overReplyCap(err) {
			r.Capped = append(r.Capped, "reply-bytes")
		}
		r.DriftErr = fmt.Errorf("sweep: list drift findings %s: %w", socket, err)
		return
	}
	if n := len(drift.GetFindings()); n > p.limits.MaxFindings {
		r.Capped = append(r.Capped, "drift-findings")
		r.DriftErr = fmt.Errorf("sweep: list drift findings %s: %d findings, over the cap of %d: dropped", socket, n, p.limits.MaxFindings)
		return
	}
	r.DriftFindings = drift.GetFindings()
}

// listEnded fills r's Ended (or EndedErr) with ListEndedActivations, under
// what is left of ctx: a daemon whose current workload cannot be read still
// hands over the activations that ended there.
func (p poller) listEnded(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, socket string, r *DaemonResult) {
	if err := ctx.Err(); err != nil {
		r.EndedErr = fmt.Errorf("sweep: list ended activations %s: no time left: %w", socket, err)
		return
	}
	ended, log, err := ListEndedLog(ctx, client, p.limits)
	setEnded(socket, r, ended, err)
	r.EndedLog = firstPageLog(log, ended)
}

// firstPageLog is the ended log as the first page of ended told it, from
// log, the last page's: a page's lowest_sequence is its first record's, so
// the first page's is the first record's (the oldest held when it was
// read), or log's own when no record was read.
func firstPageLog(log *sandboxstatsv1.EndedLog, ended []*sandboxstatsv1.EndedActivation) *sandboxstatsv1.EndedLog {
	if log == nil || len(ended) == 0 || ended[0].GetInstanceId() != log.GetInstanceId() {
		return log
	}
	first := proto.CloneOf(log)
	first.LowestSequence = ended[0].GetSequence()
	return first
}

// busyPause is how long a poll refused TOO_MANY_READS waits before asking
// once more (statsd leaves a read's slot as its status is queued: a slot is
// soon free unless a storm holds them all).
var busyPause = 50 * time.Millisecond

// tooManyReads reports whether err is statsd's refusal of a read beyond
// its bound on reads in flight (RESOURCE_EXHAUSTED, ErrorInfo reason
// TOO_MANY_READS): the daemon is busy, its answer was never sent.
func tooManyReads(err error) bool {
	return status.Code(err) == codes.ResourceExhausted && api.ReasonOf(err) == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_READS)
}

// overReplyCap reports whether err is an answer over the reply cap (gRPC's
// own RESOURCE_EXHAUSTED for a message over MaxCallRecvMsgSize), or any
// other RESOURCE_EXHAUSTED but a busy daemon's refusal.
func overReplyCap(err error) bool {
	return status.Code(err) == codes.ResourceExhausted && !tooManyReads(err)
}

// pause waits d, if ctx leaves at least twice d after it (for the call
// after the pause), and reports whether it did.
func pause(ctx context.Context, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 3*d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
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

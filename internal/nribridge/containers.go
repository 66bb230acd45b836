package nribridge

// A pod's container set while its activation runs (split from shard.go):
// UpdateWorkloadContainers, which changes the set without a new
// activation, and what the bridge does when statsd does not know it.

import (
	"context"
	"log/slog"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// sameSandbox reports whether two requests bind the same way apart from
// the container set (containers, and Kata's container_ids): then a change
// is an UpdateWorkloadContainers, not a Run (which would begin a new
// activation).
func sameSandbox(a, b *sandboxstatsv1.RunWorkloadRequest) bool {
	strip := func(r *sandboxstatsv1.RunWorkloadRequest) *sandboxstatsv1.RunWorkloadRequest {
		c := proto.Clone(r).(*sandboxstatsv1.RunWorkloadRequest)
		if c.Sandbox != nil {
			c.Sandbox.Containers, c.Sandbox.ContainerIds = nil, nil
		}
		return c
	}
	return proto.Equal(strip(a), strip(b))
}

// updateContainers sends req's container set to the binding of uid on
// this statsd (UpdateWorkloadContainers), under the call deadline.
//
// only: the binding is req's but for its containers (the bridge bound it):
// the update is all there is to do, and it returns false. Otherwise the
// bridge does not know the request that bound it (a listing found it: the
// bridge restarted, or a Run's outcome was not known): the set is made
// current before the Run that follows (true: go on to it), so that the Run
// is a retry if the sandbox is the same, whether statsd compares the
// containers of two Runs or not.
//
// A statsd that answers UNIMPLEMENTED (older than the call) is logged once
// per statsd and counted (sandboxstats_nri_statsd_calls_total, result
// Unimplemented); the set is taken as sent, so nothing retries it: the
// binding keeps the containers its Run named until the pod changes again.
func (s *shard) updateContainers(ctx context.Context, uid string, req *sandboxstatsv1.RunWorkloadRequest, only bool) bool {
	b := s.b
	cctx, cancel := context.WithTimeout(ctx, b.opt.CallTimeout)
	resp, err := s.lc.UpdateWorkloadContainers(cctx, &sandboxstatsv1.UpdateWorkloadContainersRequest{
		ActorUid: uid, Containers: req.GetSandbox().GetContainers()})
	cancel()
	if ctx.Err() != nil {
		return false
	}
	b.m.call(s.label, "update-containers", err)
	reason := api.ReasonOf(err)
	notBound := reason == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH) || reason == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case err == nil:
		if only {
			s.known[uid] = req
			s.noteChange(uid)
			s.resetRetry(uid)
		}
		b.notes.add(slog.LevelInfo, "updated a pod's containers", "", "uid", uid, "statsd", s.label,
			"containers", containerNames(req), "epoch_unix_nano", resp.GetEpochUnixNano())
		return !only
	case status.Code(err) == codes.Unimplemented:
		if !s.warnedOld {
			s.warnedOld = true
			b.notes.add(slog.LevelWarn, "nri: statsd does not implement UpdateWorkloadContainers (older than the bridge): a pod's containers stay as its Run named them",
				"", "statsd", s.label, "err", err)
		}
		if only {
			s.known[uid] = req
			s.resetRetry(uid)
		}
		return !only
	case notBound:
		// Not bound there (any more): a Run binds it, with the set.
		if only {
			delete(s.known, uid)
			s.noteChange(uid)
			s.enqueue(uid)
		}
		return !only
	case only:
		s.failed(uid, "update-containers", err)
		return false
	case reason == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST):
		// The binding found is not one the set fits (another class): the
		// Run replaces it.
		return true
	default:
		s.failed(uid, "update-containers", err)
		return false
	}
}

// containerNames is req's containers for a log: "name=id ...".
func containerNames(req *sandboxstatsv1.RunWorkloadRequest) string {
	var parts []string
	for _, c := range req.GetSandbox().GetContainers() {
		parts = append(parts, c.GetName()+"="+c.GetId())
	}
	return strings.Join(parts, " ")
}

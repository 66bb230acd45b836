package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// LifecycleService implements WorkloadLifecycleService, the launcher's side.
type LifecycleService struct {
	sandboxstatsv1.UnimplementedWorkloadLifecycleServiceServer

	store  *identity.Store
	drift  *drift.Checker // nil: no drift check (nothing seen dead)
	logger *slog.Logger
}

var _ sandboxstatsv1.WorkloadLifecycleServiceServer = (*LifecycleService)(nil)

// NewLifecycleService returns the lifecycle side over store.
func NewLifecycleService(store *identity.Store, logger *slog.Logger) *LifecycleService {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &LifecycleService{store: store, logger: logger}
}

func (l *LifecycleService) bind(ctx context.Context, op identity.Op, id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) (int64, *sandboxstatsv1.EndedActivation, error) {
	b, replaced, err := l.store.Bind(ctx, op, identityFromProto(id), refFromProto(ref))
	if replaced != nil {
		logEnded(l.logger, replaced)
	}
	if err != nil {
		l.logger.Warn("lifecycle call refused", "op", op, "actor_uid", id.GetActorUid(), "err", err)
		return 0, endedToProto(replaced), lifecycleError(err)
	}
	l.logger.Info("workload bound", "op", op, "actor_uid", b.Identity.ActorUID, "class", b.Ref.Class, "epoch_unix_nano", b.EpochUnixNano)
	return b.EpochUnixNano, endedToProto(replaced), nil
}

// RunWorkload binds a workload and starts an epoch.
func (l *LifecycleService) RunWorkload(ctx context.Context, req *sandboxstatsv1.RunWorkloadRequest) (*sandboxstatsv1.RunWorkloadResponse, error) {
	epoch, replaced, err := l.bind(ctx, identity.OpRun, req.GetIdentity(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: epoch, Replaced: replaced}, nil
}

// RestoreWorkload binds a restored workload and starts an epoch.
func (l *LifecycleService) RestoreWorkload(ctx context.Context, req *sandboxstatsv1.RestoreWorkloadRequest) (*sandboxstatsv1.RestoreWorkloadResponse, error) {
	epoch, replaced, err := l.bind(ctx, identity.OpRestore, req.GetIdentity(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &sandboxstatsv1.RestoreWorkloadResponse{EpochUnixNano: epoch, Replaced: replaced}, nil
}

// UpdateWorkloadContainers replaces the bound actor's container set; the
// epoch and the activation stay.
func (l *LifecycleService) UpdateWorkloadContainers(ctx context.Context, req *sandboxstatsv1.UpdateWorkloadContainersRequest) (*sandboxstatsv1.UpdateWorkloadContainersResponse, error) {
	b, err := l.store.UpdateContainers(ctx, req.GetActorUid(), containerRefsFromProto(req.GetContainers()))
	if err != nil {
		l.logger.Warn("container update refused", "actor_uid", req.GetActorUid(), "err", err)
		return nil, lifecycleError(err)
	}
	return &sandboxstatsv1.UpdateWorkloadContainersResponse{EpochUnixNano: b.EpochUnixNano}, nil
}

// CheckpointWorkload ends the bound activation (one last bounded read, the
// record) and forgets the workload. With runtime_stopped, a dead sandbox is
// the expected end unless the drift check had seen it dead before the call
// (its findings, asked without waiting for a cycle).
func (l *LifecycleService) CheckpointWorkload(ctx context.Context, req *sandboxstatsv1.CheckpointWorkloadRequest) (*sandboxstatsv1.CheckpointWorkloadResponse, error) {
	opt := identity.ReleaseOptions{RuntimeStopped: req.GetRuntimeStopped()}
	var (
		seen    drift.Finding
		wasSeen bool
	)
	if l.drift != nil {
		opt.SeenDead = func(actorUID string, epoch int64, by time.Time) bool {
			seen, wasSeen = l.drift.SeenDead(actorUID, epoch, by)
			return wasSeen
		}
	}
	e, err := l.store.ReleaseWith(ctx, req.GetActorUid(), opt)
	if err != nil {
		l.logger.Warn("checkpoint refused", "actor_uid", req.GetActorUid(), "err", err)
		return nil, lifecycleError(err)
	}
	if e != nil {
		var attrs []any
		if opt.RuntimeStopped {
			attrs = append(attrs, "runtime_stopped", true)
		}
		if wasSeen && e.Outcome == identity.OutcomeSandboxDead {
			attrs = append(attrs, "seen_dead", seen.Kind.String()+" "+seen.Subject, "seen_dead_unix_nano", seen.FirstSeen.UnixNano())
		}
		logEnded(l.logger, e, attrs...)
	}
	return &sandboxstatsv1.CheckpointWorkloadResponse{Ended: endedToProto(e)}, nil
}

// logEnded logs an ended activation, with the call's own attributes.
func logEnded(logger *slog.Logger, e *identity.Ended, extra ...any) {
	attrs := []any{"actor_uid", e.Identity.ActorUID, "epoch_unix_nano", e.EpochUnixNano,
		"outcome", endedOutcomeName(e.Outcome), "final", finalProvenanceName(e.Provenance)}
	attrs = append(attrs, extra...)
	if e.CPUUsec != nil {
		attrs = append(attrs, "cpu_usec", *e.CPUUsec)
	}
	if e.FinalReason != "" {
		attrs = append(attrs, "final_reason", e.FinalReason)
	}
	logger.Info("activation ended", attrs...)
}

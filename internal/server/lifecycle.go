package server

import (
	"context"
	"log/slog"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// LifecycleService implements WorkloadLifecycleService, the launcher's side.
type LifecycleService struct {
	sandboxstatsv1.UnimplementedWorkloadLifecycleServiceServer

	store  *identity.Store
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

func (l *LifecycleService) bind(op identity.Op, id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) (int64, error) {
	b, err := l.store.Bind(op, IdentityFromProto(id), RefFromProto(ref))
	if err != nil {
		l.logger.Warn("lifecycle call refused", "op", op, "actor_uid", id.GetActorUid(), "err", err)
		return 0, lifecycleError(err)
	}
	l.logger.Info("workload bound", "op", op, "actor_uid", b.Identity.ActorUID, "class", b.Ref.Class, "epoch_unix_nano", b.EpochUnixNano)
	return b.EpochUnixNano, nil
}

// RunWorkload binds a workload and starts an epoch.
func (l *LifecycleService) RunWorkload(_ context.Context, req *sandboxstatsv1.RunWorkloadRequest) (*sandboxstatsv1.RunWorkloadResponse, error) {
	epoch, err := l.bind(identity.OpRun, req.GetIdentity(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: epoch}, nil
}

// RestoreWorkload binds a restored workload and starts an epoch.
func (l *LifecycleService) RestoreWorkload(_ context.Context, req *sandboxstatsv1.RestoreWorkloadRequest) (*sandboxstatsv1.RestoreWorkloadResponse, error) {
	epoch, err := l.bind(identity.OpRestore, req.GetIdentity(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &sandboxstatsv1.RestoreWorkloadResponse{EpochUnixNano: epoch}, nil
}

// CheckpointWorkload forgets the bound workload.
func (l *LifecycleService) CheckpointWorkload(_ context.Context, req *sandboxstatsv1.CheckpointWorkloadRequest) (*sandboxstatsv1.CheckpointWorkloadResponse, error) {
	if err := l.store.Release(req.GetActorUid()); err != nil {
		l.logger.Warn("checkpoint refused", "actor_uid", req.GetActorUid(), "err", err)
		return nil, lifecycleError(err)
	}
	l.logger.Info("workload forgotten", "actor_uid", req.GetActorUid())
	return &sandboxstatsv1.CheckpointWorkloadResponse{}, nil
}

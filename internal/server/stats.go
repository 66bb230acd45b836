package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// StatsService implements the read-only WorkloadStatsService. It never takes
// the lifecycle lock.
type StatsService struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer

	store  *identity.Store
	now    func() time.Time
	logger *slog.Logger
	drift  *drift.Checker // nil: the check is off
	// afterRead, when set, runs between the read and the identity re-check
	// (tests use it to change the binding under a read).
	afterRead func()
}

var _ sandboxstatsv1.WorkloadStatsServiceServer = (*StatsService)(nil)

// NewStatsService returns the read side over store. now defaults to
// time.Now.
func NewStatsService(store *identity.Store, now func() time.Time, logger *slog.Logger) *StatsService {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &StatsService{store: store, now: now, logger: logger}
}

// errBindingChanged is returned by sample when the binding changed under the
// read: the numbers belong to no one and are dropped.
var errBindingChanged = errors.New("binding changed during the read")

// bound returns the binding for actorUID, or the status that says why not.
func (s *StatsService) bound(actorUID string) (*identity.Binding, error) {
	if err := identity.ValidateActorUID(actorUID); err != nil {
		return nil, statusError(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_ACTOR_UID, "%v", err)
	}
	b := s.store.Current()
	if b == nil {
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD, "no workload is bound to this statsd")
	}
	if b.Identity.ActorUID != actorUID {
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH,
			"statsd is measuring actor %q, not the requested %q", b.Identity.ActorUID, actorUID)
	}
	return b, nil
}

// sample reads b's source (and host views if asked) and re-checks that b is
// still the binding afterwards. The read is bounded by the source.
func (s *StatsService) sample(ctx context.Context, b *identity.Binding, includeHost bool) (*sandboxstatsv1.WorkloadStatsSample, error) {
	observed := s.now().UnixNano()
	var (
		reading source.Reading
		err     error
	)
	if b.Source == nil {
		err = source.ErrNotMeasurable
	} else {
		reading, err = b.Source.Sample(ctx)
	}
	var host *sandboxstatsv1.HostStats
	if err == nil && includeHost {
		host = s.host(ctx, b)
	}
	if s.afterRead != nil {
		s.afterRead()
	}
	if s.store.Current() != b {
		return nil, errBindingChanged
	}
	if err != nil {
		return nil, err
	}
	b.Activation.Observe(reading, observed)
	sample := sampleFromReading(b, reading, observed)
	sample.Host = host
	sample.OpenDriftFindings = s.openFindings(b.Identity.ActorUID)
	return sample, nil
}

// host reads the host views; a failure is reported inside HostStats, since
// the host view never fails a sample.
func (s *StatsService) host(ctx context.Context, b *identity.Binding) *sandboxstatsv1.HostStats {
	if b.Host == nil {
		return &sandboxstatsv1.HostStats{ObservedAtUnixNano: s.now().UnixNano(), UnavailableReason: "no host sampler for this sandbox"}
	}
	h, err := b.Host.SampleHost(ctx)
	if err != nil {
		return &sandboxstatsv1.HostStats{ObservedAtUnixNano: s.now().UnixNano(), UnavailableReason: foreign.Bound(err.Error(), maxStatusMessage)}
	}
	return hostToProto(h)
}

// StatsWorkload returns one sample of the named workload.
func (s *StatsService) StatsWorkload(ctx context.Context, req *sandboxstatsv1.StatsWorkloadRequest) (*sandboxstatsv1.StatsWorkloadResponse, error) {
	b, err := s.bound(req.GetActorUid())
	if err != nil {
		return nil, err
	}
	sample, err := s.sample(ctx, b, req.GetIncludeHost())
	switch {
	case errors.Is(err, errBindingChanged):
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED,
			"the binding of actor %q changed while the sample was being read", b.Identity.ActorUID)
	case err != nil:
		return nil, readError(err)
	}
	return &sandboxstatsv1.StatsWorkloadResponse{Sample: sample}, nil
}

// StatsActiveWorkloads is the discovery read: every normal state is an answer.
func (s *StatsService) StatsActiveWorkloads(ctx context.Context, req *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	// The binding and the ended activations are one state (an activation
	// is either bound or ended in it, never both nor neither): the answer is
	// the state before a concurrent Checkpoint or the one after, never a mix.
	b, endedRecs := s.store.Snapshot()
	ended := endedListToProto(endedRecs)
	if b == nil {
		return noWorkload(ended), nil
	}
	sample, err := s.sample(ctx, b, req.GetIncludeHost())
	switch {
	case errors.Is(err, errBindingChanged):
		// A lifecycle call moved on during the read: answer the state it
		// left, with no sample of the old binding.
		now, endedNow := s.store.Snapshot()
		if now == nil {
			return noWorkload(endedListToProto(endedNow)), nil
		}
		return notMeasurableYet("the binding changed while the sample was being read", endedListToProto(endedNow)), nil
	case errors.Is(err, source.ErrTimeout), errors.Is(err, source.ErrMalformed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return nil, readError(err)
	case err != nil:
		return notMeasurableYet(foreign.Bound(err.Error(), maxStatusMessage), ended), nil
	}
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: []*sandboxstatsv1.WorkloadStatsSample{sample}, Ended: ended}, nil
}

func noWorkload(ended []*sandboxstatsv1.EndedActivation) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{
		NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		NoSampleDetail: "no workload is bound to this statsd",
		Ended:          ended,
	}
}

func notMeasurableYet(detail string, ended []*sandboxstatsv1.EndedActivation) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{
		NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET,
		NoSampleDetail: detail,
		Ended:          ended,
	}
}

// ListEndedActivations lists the recently ended activations; it reads no
// source.
func (s *StatsService) ListEndedActivations(context.Context, *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	return &sandboxstatsv1.ListEndedActivationsResponse{Ended: endedListToProto(s.store.Ended())}, nil
}

// StatsHost returns only the host views, even when the sandbox's own source
// cannot be read.
func (s *StatsService) StatsHost(ctx context.Context, req *sandboxstatsv1.StatsHostRequest) (*sandboxstatsv1.StatsHostResponse, error) {
	b, err := s.bound(req.GetActorUid())
	if err != nil {
		return nil, err
	}
	host := s.host(ctx, b)
	if s.afterRead != nil {
		s.afterRead()
	}
	if s.store.Current() != b {
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED,
			"the binding of actor %q changed while the host view was being read", b.Identity.ActorUID)
	}
	return &sandboxstatsv1.StatsHostResponse{
		Identity:      identityToProto(b.Identity),
		SandboxClass:  classToProto(b.Ref.Class),
		EpochUnixNano: b.EpochUnixNano,
		Host:          host,
	}, nil
}

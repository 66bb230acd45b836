package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

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
	gate   *readGate      // the reads served at once (reads.go)
	share  activeShare    // the discovery answer being read, shared
	// baselines holds the answers' epoch baselines (baselinecache.go).
	baselines baselineCache
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
	return &StatsService{store: store, now: now, logger: logger, gate: newReadGate(DefaultMaxReads)}
}

// errBindingChanged is returned by sample when the binding changed under the
// read: the numbers belong to no one and are dropped.
var errBindingChanged = errors.New("binding changed during the read")

// bound returns the binding for actorUID, or the status that says why not.
func (s *StatsService) bound(actorUID string) (*identity.Binding, error) {
	if err := identity.ValidateActorUID(actorUID); err != nil {
		return nil, statusError(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_ACTOR_UID, "%v", err)
	}
	if b := s.store.Bound(actorUID); b != nil {
		return b, nil
	}
	switch n := len(s.store.Bindings()); n {
	case 0:
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD, "no workload is bound to this statsd")
	case 1:
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH,
			"statsd is measuring another actor, not the requested %q", actorUID)
	default:
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH,
			"actor %q is not among the %d workloads this statsd measures", actorUID, n)
	}
}

// sample reads b's source (and host views if asked) and re-checks that b is
// still the binding afterwards. The read is bounded by the source. With
// knownAbsent, absent values with a KnownAbsent code go as codes.
func (s *StatsService) sample(ctx context.Context, b *identity.Binding, includeHost, knownAbsent bool) (*sandboxstatsv1.WorkloadStatsSample, error) {
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
	if !s.store.IsBound(b) {
		return nil, errBindingChanged
	}
	if err != nil {
		return nil, err
	}
	reading = b.Activation.Observe(reading, observed) // with the exited containers, named from the set
	var known []sandboxstatsv1.KnownAbsent
	if knownAbsent {
		known, reading.Absent = splitKnownAbsent(reading.Absent)
	}
	sample := sampleFromReading(b, reading, observed, &s.baselines)
	sample.KnownAbsent = known
	sample.Host = host
	sample.OpenDriftFindings = s.openFindings(b.Identity.ActorUID)
	capSample(sample)
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
	sample, err := s.sample(ctx, b, req.GetIncludeHost(), req.GetKnownAbsent())
	switch {
	case errors.Is(err, errBindingChanged):
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED,
			"the binding of actor %q changed while the sample was being read", b.Identity.ActorUID)
	case err != nil:
		return nil, readError(err)
	}
	return &sandboxstatsv1.StatsWorkloadResponse{Sample: sample}, nil
}

// withEnded gives r the first page of ended (oldest first): as many records
// as fit beside what r holds in pageBytes, and the token of the rest.
func withEnded(r *sandboxstatsv1.StatsActiveWorkloadsResponse, ended []*identity.Ended) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	r.Ended, r.EndedNextPageToken = servePage(ended, 0, pageBytes-maxTokenField-proto.Size(r), activeEndedField)
	return r
}

// withEndedLog is withEnded with the ended records' log (pages.go).
func (s *StatsService) withEndedLog(r *sandboxstatsv1.StatsActiveWorkloadsResponse, ended []*identity.Ended) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	r = withEnded(r, ended)
	r.EndedLog = answerLog(s.store.EndedLog(), ended)
	return r
}

// The numbers of the ended activations' fields in
// StatsActiveWorkloadsResponse and ListEndedActivationsResponse.
const (
	activeEndedField = 4
	listEndedField   = 1
)

func noWorkload() *sandboxstatsv1.StatsActiveWorkloadsResponse {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{
		NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		NoSampleDetail: "no workload is bound to this statsd",
	}
}

func notMeasurableYet(detail string) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{
		NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET,
		NoSampleDetail: detail,
	}
}

// ListEndedActivations lists the recently ended activations a page at a
// time (see pages.go); it reads no source.
func (s *StatsService) ListEndedActivations(_ context.Context, req *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	log := s.store.EndedLog()
	resp, err := listEndedPage(log.Records, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp.EndedLog = answerLog(log, log.Records)
	return resp, nil
}

// listEndedPage is the page of list (oldest first) that token asks for.
func listEndedPage(list []*identity.Ended, token string) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	k, ok, err := parsePageToken(token)
	if err != nil {
		return nil, statusError(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, "page_token: %v", err)
	}
	resp := &sandboxstatsv1.ListEndedActivationsResponse{}
	resp.Ended, resp.NextPageToken = servePage(list, pageStart(list, k, ok), pageBytes-maxTokenField, listEndedField)
	return resp, nil
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
	if !s.store.IsBound(b) {
		return nil, statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_CHANGED,
			"the binding of actor %q changed while the host view was being read", b.Identity.ActorUID)
	}
	resp := &sandboxstatsv1.StatsHostResponse{
		Identity:      identityToProto(b.Identity),
		SandboxClass:  classToProto(b.Ref.Class),
		EpochUnixNano: b.EpochUnixNano,
		Host:          host,
	}
	capHostView(resp)
	return resp, nil
}

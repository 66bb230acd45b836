package statsdfake

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Lifecycle is a fake statsd for a launcher's tests (the NRI bridge's): it
// serves WorkloadLifecycleService on one Unix socket and
// WorkloadStatsService.StatsActiveWorkloads on another, keeping bindings
// with statsd's semantics (internal/identity): a Run identical to the
// binding (its containers too) is a retry; the same actor with another
// identity or sandbox (or another container set: the strictest statsd)
// ends
// its activation (replaced) and starts another; an actor not bound is added
// up to a ceiling (RESOURCE_EXHAUSTED TOO_MANY_WORKLOADS), unless another
// actor's binding names the same sandbox (FAILED_PRECONDITION
// WORKLOAD_BOUND); Checkpoint ends the actor's activation, a repeat returns
// the same record, an actor neither bound nor just cleared is
// ACTOR_MISMATCH (NO_WORKLOAD when nothing is bound). Every sandbox it
// ends is alive (it reads none), so every outcome is CHECKPOINTED with
// runtime_stopped or without, as statsd's is for a live sandbox; Events
// records the flag. It reads no source:
// StatsActiveWorkloads lists every binding as pending NOT_MEASURABLE,
// which is how a real statsd lists a workload it cannot read. It can hang
// (every call blocks until its caller gives up, as a SIGSTOPped statsd
// does) and be killed.
type Lifecycle struct {
	// LifecycleSocket and StatsSocket are the paths it listens on.
	LifecycleSocket, StatsSocket string

	srv []*grpc.Server

	mu       sync.Mutex
	max      int
	bindings map[string]*fakeBinding
	cleared  map[string]*sandboxstatsv1.EndedActivation
	hang     bool
	killed   bool
	lcErr    error
	events   []string
	arrived  chan struct{}
	noUpdate bool
	older    bool
	updates  []Update
}

type fakeBinding struct {
	req   *sandboxstatsv1.RunWorkloadRequest
	epoch int64
}

// StartLifecycle serves a Lifecycle in dir (lifecycle.sock, stats.sock)
// with statsd's default ceiling of 32 workloads, until the test ends.
func StartLifecycle(tb testing.TB, dir string) *Lifecycle {
	tb.Helper()
	l := &Lifecycle{
		LifecycleSocket: filepath.Join(dir, "lifecycle.sock"),
		StatsSocket:     filepath.Join(dir, "stats.sock"),
		max:             32,
		bindings:        map[string]*fakeBinding{},
		cleared:         map[string]*sandboxstatsv1.EndedActivation{},
		arrived:         make(chan struct{}, 1),
	}
	lc := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(lc, lifecycleServer{l: l})
	st := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(st, statsServer{l: l})
	for _, s := range []struct {
		srv  *grpc.Server
		path string
	}{{lc, l.LifecycleSocket}, {st, l.StatsSocket}} {
		ln, err := net.Listen("unix", s.path)
		if err != nil {
			tb.Fatalf("statsdfake: listen %s: %v", s.path, err)
		}
		go func() { _ = s.srv.Serve(ln) }()
	}
	l.srv = []*grpc.Server{lc, st}
	tb.Cleanup(l.Kill)
	return l
}

// SetMaxWorkloads sets the ceiling (statsd --max-workloads).
func (l *Lifecycle) SetMaxWorkloads(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.max = n
}

// Hang makes every call block until its caller gives up (true), or answer
// again (false).
func (l *Lifecycle) Hang(hang bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hang = hang
}

// SetLifecycleError makes every lifecycle call fail with err (a status
// error, such as UNAVAILABLE STATE_NOT_PERSISTED for a full disk), nil to
// stop.
func (l *Lifecycle) SetLifecycleError(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lcErr = err
}

// Preload binds these workloads as a previous launcher left them: a
// restarted statsd's state.
func (l *Lifecycle) Preload(reqs ...*sandboxstatsv1.RunWorkloadRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range reqs {
		l.bindings[r.GetIdentity().GetActorUid()] = &fakeBinding{req: proto.Clone(r).(*sandboxstatsv1.RunWorkloadRequest), epoch: time.Now().UnixNano()}
	}
}

// Bound returns the bound workloads' requests by actor uid.
func (l *Lifecycle) Bound() map[string]*sandboxstatsv1.RunWorkloadRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]*sandboxstatsv1.RunWorkloadRequest, len(l.bindings))
	for a, b := range l.bindings {
		out[a] = proto.Clone(b.req).(*sandboxstatsv1.RunWorkloadRequest)
	}
	return out
}

// Events returns what the lifecycle calls did, in order: "bind A" (a new
// activation of an actor not bound), "retry A" (a Run identical to the
// binding: nothing changed), "replace A" (the actor's activation ended, a
// new one began), "checkpoint A" ("checkpoint A runtime-stopped" when the
// call said runtime_stopped), "checkpoint-retry A" (the record of an actor
// just cleared again), and "refuse A REASON".
func (l *Lifecycle) Events() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// Arrived receives a value after a lifecycle call arrived (it may since
// have been answered or still hang); at most one is buffered.
func (l *Lifecycle) Arrived() <-chan struct{} { return l.arrived }

// Kill stops the daemon as a crash would: listeners closed, connections
// dropped, socket files removed.
func (l *Lifecycle) Kill() {
	l.mu.Lock()
	if l.killed {
		l.mu.Unlock()
		return
	}
	l.killed = true
	l.mu.Unlock()
	for _, s := range l.srv {
		s.Stop()
	}
	_ = os.Remove(l.LifecycleSocket)
	_ = os.Remove(l.StatsSocket)
}

// enter waits out a hang (until ctx ends) and returns the scripted
// lifecycle error, with l.mu held on success.
func (l *Lifecycle) enter(ctx context.Context, lifecycle bool) error {
	if lifecycle {
		select {
		case l.arrived <- struct{}{}:
		default:
		}
	}
	for {
		l.mu.Lock()
		if !l.hang {
			break
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if lifecycle && l.lcErr != nil {
		err := l.lcErr
		l.mu.Unlock()
		return err
	}
	return nil
}

// Status is a statsd error: code, message and the ErrorInfo reason.
func Status(code codes.Code, reason sandboxstatsv1.ErrorReason, format string, args ...any) error {
	st, err := status.New(code, fmt.Sprintf(format, args...)).WithDetails(&errdetails.ErrorInfo{Reason: api.Reason(reason), Domain: api.ErrorDomain})
	if err != nil {
		return status.Errorf(code, format, args...)
	}
	return st.Err()
}

// sameSandbox reports whether two refs name one sandbox (the fake's
// simplification of statsd's check: equal cgroup path, sentry pid or
// agent address).
func sameSandbox(a, b *sandboxstatsv1.SandboxRef) bool {
	return (a.GetCgroupPath() != "" && a.GetCgroupPath() == b.GetCgroupPath()) ||
		(a.GetSentryPid() != 0 && a.GetSentryPid() == b.GetSentryPid()) ||
		(a.GetAgentAddress() != "" && a.GetAgentAddress() == b.GetAgentAddress())
}

type lifecycleServer struct {
	sandboxstatsv1.UnimplementedWorkloadLifecycleServiceServer
	l *Lifecycle
}

func (s lifecycleServer) RunWorkload(ctx context.Context, req *sandboxstatsv1.RunWorkloadRequest) (*sandboxstatsv1.RunWorkloadResponse, error) {
	l := s.l
	if err := l.enter(ctx, true); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	actor := req.GetIdentity().GetActorUid()
	if actor == "" || req.GetSandbox().GetSandboxClass() == sandboxstatsv1.SandboxClass_SANDBOX_CLASS_UNSPECIFIED {
		l.events = append(l.events, "refuse "+actor+" INVALID_REQUEST")
		return nil, Status(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST, "actor_uid and sandbox_class are required")
	}
	req, err := l.refLocked(req)
	if err != nil {
		l.events = append(l.events, "refuse "+actor+" INVALID_REQUEST")
		return nil, err
	}
	b := l.bindings[actor]
	if b != nil && proto.Equal(b.req, req) {
		l.events = append(l.events, "retry "+actor)
		return &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: b.epoch}, nil
	}
	for other, ob := range l.bindings {
		if other != actor && sameSandbox(ob.req.GetSandbox(), req.GetSandbox()) {
			l.events = append(l.events, "refuse "+actor+" WORKLOAD_BOUND")
			return nil, Status(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_WORKLOAD_BOUND, "the sandbox is bound to another actor")
		}
	}
	if b == nil && len(l.bindings) >= l.max {
		l.events = append(l.events, "refuse "+actor+" TOO_MANY_WORKLOADS")
		return nil, Status(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_WORKLOADS, "%d workloads are bound, the most this statsd measures", len(l.bindings))
	}
	resp := &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: time.Now().UnixNano()}
	if b != nil {
		resp.Replaced = l.endedLocked(actor, b, sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED)
		l.events = append(l.events, "replace "+actor)
	} else {
		l.events = append(l.events, "bind "+actor)
	}
	delete(l.cleared, actor)
	l.bindings[actor] = &fakeBinding{req: proto.Clone(req).(*sandboxstatsv1.RunWorkloadRequest), epoch: resp.EpochUnixNano}
	return resp, nil
}

func (l *Lifecycle) endedLocked(actor string, b *fakeBinding, outcome sandboxstatsv1.ActivationOutcome) *sandboxstatsv1.EndedActivation {
	id := b.req.GetIdentity()
	return &sandboxstatsv1.EndedActivation{
		Identity:      proto.Clone(id).(*sandboxstatsv1.WorkloadIdentity),
		SandboxClass:  b.req.GetSandbox().GetSandboxClass(),
		EpochUnixNano: b.epoch, EndUnixNano: time.Now().UnixNano(), Outcome: outcome,
	}
}

func (s lifecycleServer) RestoreWorkload(ctx context.Context, req *sandboxstatsv1.RestoreWorkloadRequest) (*sandboxstatsv1.RestoreWorkloadResponse, error) {
	resp, err := s.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: req.GetIdentity(), Sandbox: req.GetSandbox()})
	if err != nil {
		return nil, err
	}
	return &sandboxstatsv1.RestoreWorkloadResponse{EpochUnixNano: resp.GetEpochUnixNano(), Replaced: resp.GetReplaced()}, nil
}

func (s lifecycleServer) CheckpointWorkload(ctx context.Context, req *sandboxstatsv1.CheckpointWorkloadRequest) (*sandboxstatsv1.CheckpointWorkloadResponse, error) {
	l := s.l
	if err := l.enter(ctx, true); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	actor := req.GetActorUid()
	if b := l.bindings[actor]; b != nil {
		e := l.endedLocked(actor, b, sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED)
		delete(l.bindings, actor)
		l.cleared[actor] = e
		ev := "checkpoint " + actor
		if req.GetRuntimeStopped() {
			ev += " runtime-stopped"
		}
		l.events = append(l.events, ev)
		return &sandboxstatsv1.CheckpointWorkloadResponse{Ended: e}, nil
	}
	if e := l.cleared[actor]; e != nil {
		l.events = append(l.events, "checkpoint-retry "+actor)
		return &sandboxstatsv1.CheckpointWorkloadResponse{Ended: e}, nil
	}
	if len(l.bindings) == 0 {
		l.events = append(l.events, "refuse "+actor+" NO_WORKLOAD")
		return nil, Status(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD, "no workload is bound")
	}
	l.events = append(l.events, "refuse "+actor+" ACTOR_MISMATCH")
	return nil, Status(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH, "actor not bound here")
}

type statsServer struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	l *Lifecycle
}

// StatsActiveWorkloads lists every binding as pending (nothing is read).
func (s statsServer) StatsActiveWorkloads(ctx context.Context, _ *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	l := s.l
	if err := l.enter(ctx, false); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	if len(l.bindings) == 0 {
		return &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD}, nil
	}
	resp := &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET}
	for _, actor := range slices.Sorted(maps.Keys(l.bindings)) {
		b := l.bindings[actor]
		resp.Pending = append(resp.Pending, &sandboxstatsv1.PendingWorkload{
			Identity: proto.Clone(b.req.GetIdentity()).(*sandboxstatsv1.WorkloadIdentity), SandboxClass: b.req.GetSandbox().GetSandboxClass(),
			EpochUnixNano: b.epoch, Reason: sandboxstatsv1.ErrorReason_ERROR_REASON_NOT_MEASURABLE, Detail: "statsdfake reads no source",
		})
	}
	return resp, nil
}

var (
	_ sandboxstatsv1.WorkloadLifecycleServiceServer = lifecycleServer{}
	_ sandboxstatsv1.WorkloadStatsServiceServer     = statsServer{}
)

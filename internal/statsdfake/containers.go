package statsdfake

// UpdateWorkloadContainers in the Lifecycle fake (split from lifecycle.go):
// the bound actor's container set replaced without a new activation, each
// call recorded; or UNIMPLEMENTED, as a statsd older than the call answers.

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Update is one UpdateWorkloadContainers call the fake applied.
type Update struct {
	Actor string
	// Containers are the set sent, as "name=id" in its order.
	Containers []string
	// Epoch is the activation's, unchanged by the call.
	Epoch int64
}

// SetUpdateUnimplemented makes UpdateWorkloadContainers answer
// UNIMPLEMENTED (true), as a statsd older than the call does, or apply it
// (false).
func (l *Lifecycle) SetUpdateUnimplemented(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noUpdate = v
}

// Updates returns the UpdateWorkloadContainers calls applied, in order.
func (l *Lifecycle) Updates() []Update {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.updates)
}

// Names is a set of ContainerRefs as "name=id" in its order.
func Names(refs []*sandboxstatsv1.ContainerRef) []string {
	out := []string{}
	for _, c := range refs {
		out = append(out, c.GetName()+"="+c.GetId())
	}
	return out
}

// validContainers checks a set as statsd's validator does: at most 25, ids
// unique, 1 to 128 bytes of printable ASCII, names at most 253.
func validContainers(refs []*sandboxstatsv1.ContainerRef) bool {
	seen := map[string]bool{}
	printable := func(s string) bool {
		return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0
	}
	for _, c := range refs {
		id := c.GetId()
		if id == "" || len(id) > 128 || !printable(id) || strings.Contains(id, " ") || seen[id] || len(c.GetName()) > 253 || !printable(c.GetName()) {
			return false
		}
		seen[id] = true
	}
	return len(refs) <= 25
}

// UpdateWorkloadContainers replaces the bound actor's containers (its
// binding's SandboxRef.containers), keeping the epoch: "update A" in
// Events, the call in Updates.
func (s lifecycleServer) UpdateWorkloadContainers(ctx context.Context, req *sandboxstatsv1.UpdateWorkloadContainersRequest) (*sandboxstatsv1.UpdateWorkloadContainersResponse, error) {
	l := s.l
	if err := l.enter(ctx, true); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	actor := req.GetActorUid()
	if l.noUpdate || l.older {
		l.events = append(l.events, "unimplemented "+actor)
		return nil, status.Error(codes.Unimplemented, "method UpdateWorkloadContainers not implemented")
	}
	b := l.bindings[actor]
	switch {
	case b == nil && len(l.bindings) == 0:
		l.events = append(l.events, "refuse "+actor+" NO_WORKLOAD")
		return nil, Status(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD, "no workload is bound")
	case b == nil:
		l.events = append(l.events, "refuse "+actor+" ACTOR_MISMATCH")
		return nil, Status(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH, "actor not bound here")
	case !validContainers(req.GetContainers()):
		l.events = append(l.events, "refuse "+actor+" INVALID_REQUEST")
		return nil, Status(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST, "containers do not validate")
	}
	b.req.Sandbox.Containers = nil
	for _, c := range req.GetContainers() {
		b.req.Sandbox.Containers = append(b.req.Sandbox.Containers, proto.Clone(c).(*sandboxstatsv1.ContainerRef))
	}
	if len(b.req.Sandbox.ContainerIds) > 0 {
		b.req.Sandbox.ContainerIds = api.ContainerIDs(req.GetContainers()) // the form the bridge's next Run has
	}
	l.events = append(l.events, "update "+actor)
	l.updates = append(l.updates, Update{Actor: actor, Containers: Names(req.GetContainers()), Epoch: b.epoch})
	return &sandboxstatsv1.UpdateWorkloadContainersResponse{EpochUnixNano: b.epoch}, nil
}

// SetOlder makes the fake a statsd older than SandboxRef.containers and
// UpdateWorkloadContainers (true), as during a rolling upgrade that
// updates the bridge first: a Run or Restore's containers are dropped (an
// unknown field to it), so a MICROVM ref without container_ids is
// INVALID_REQUEST, and UpdateWorkloadContainers answers UNIMPLEMENTED.
func (l *Lifecycle) SetOlder(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.older = v
}

// refLocked is req's sandbox as this statsd reads it: a MICROVM ref needs
// container_ids or containers, and when it has both (a bridge that also
// speaks to older statsds) the same ids in the same order; an older statsd
// (SetOlder) drops containers first.
func (l *Lifecycle) refLocked(req *sandboxstatsv1.RunWorkloadRequest) (*sandboxstatsv1.RunWorkloadRequest, error) {
	if l.older && len(req.GetSandbox().GetContainers()) > 0 {
		req = proto.Clone(req).(*sandboxstatsv1.RunWorkloadRequest)
		req.Sandbox.Containers = nil
	}
	ref := req.GetSandbox()
	if ref.GetSandboxClass() != sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM {
		return req, nil
	}
	ids, set := ref.GetContainerIds(), ref.GetContainers()
	switch {
	case len(ids) == 0 && len(set) == 0:
		return nil, Status(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST, "a microvm sandbox needs 1 to 25 container_ids, got 0")
	case len(ids) > 0 && len(set) > 0 && !slices.Equal(ids, api.ContainerIDs(set)):
		return nil, Status(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST, "container_ids and containers differ")
	}
	return req, nil
}

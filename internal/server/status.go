package server

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// maxStatusMessage bounds the message of every status statsd returns: the
// sources cut foreign text where it enters, and this is the backstop (a
// message travels in an HTTP/2 header; a 4 MB one broke it).
const maxStatusMessage = 8 << 10

// statusError builds a status with an ErrorInfo detail and a bounded
// message.
func statusError(code codes.Code, reason sandboxstatsv1.ErrorReason, format string, args ...any) error {
	st := status.New(code, foreign.Bound(fmt.Sprintf(format, args...), maxStatusMessage))
	return api.WithErrorInfo(st, api.Reason(reason)).Err()
}

// readError maps an error from a source read to a status.
func readError(err error) error {
	if errors.Is(err, context.Canceled) && !errors.Is(err, source.ErrTimeout) {
		return status.Error(codes.Canceled, foreign.Bound(err.Error(), maxStatusMessage))
	}
	code, reason := readReason(err)
	return statusError(code, reason, "%v", err)
}

// readReason classifies an error from a source read: the code and reason a
// keyed read answers, and the reason a discovery read's pending entry
// carries.
func readReason(err error) (codes.Code, sandboxstatsv1.ErrorReason) {
	switch {
	case errors.Is(err, source.ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return codes.DeadlineExceeded, sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT
	case errors.Is(err, source.ErrMalformed):
		return codes.Internal, sandboxstatsv1.ErrorReason_ERROR_REASON_MALFORMED_SOURCE
	default:
		// ErrNotMeasurable, and anything a source could not classify (a
		// permission error, a vanished file): the workload is here but
		// cannot be measured right now.
		return codes.Unavailable, sandboxstatsv1.ErrorReason_ERROR_REASON_NOT_MEASURABLE
	}
}

// lifecycleError maps an identity error to a status.
func lifecycleError(err error) error {
	switch {
	case errors.Is(err, identity.ErrInvalid):
		return statusError(codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST, "%v", err)
	case errors.Is(err, identity.ErrTooManyWorkloads):
		return statusError(codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_WORKLOADS, "%v", err)
	case errors.Is(err, identity.ErrOtherWorkload):
		return statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_WORKLOAD_BOUND, "%v", err)
	case errors.Is(err, identity.ErrActorMismatch):
		return statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH, "%v", err)
	case errors.Is(err, identity.ErrNoWorkload):
		return statusError(codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD, "%v", err)
	case errors.Is(err, identity.ErrNotPersisted) && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS)):
		// The disk is full or read-only: nothing changed, and a retry once
		// it is writable succeeds.
		return statusError(codes.Unavailable, sandboxstatsv1.ErrorReason_ERROR_REASON_STATE_NOT_PERSISTED, "%v", err)
	case errors.Is(err, identity.ErrNotPersisted):
		return statusError(codes.Internal, sandboxstatsv1.ErrorReason_ERROR_REASON_STATE_NOT_PERSISTED, "%v", err)
	default:
		return status.Error(codes.Internal, foreign.Bound(err.Error(), maxStatusMessage))
	}
}

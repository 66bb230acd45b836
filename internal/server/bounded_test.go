package server

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestErrorTextIsBounded: whatever a source's error says (a source that
// forgot to cut foreign text), the status message and the no-sample detail
// statsd returns stay under maxStatusMessage and hold no raw control
// character: a 4 MB message in the grpc-message header broke HTTP/2.
func TestErrorTextIsBounded(t *testing.T) {
	huge := strings.Repeat("E", 4<<20) + "\x1b]0;pwned\x07"
	for _, sentinel := range []error{source.ErrNotMeasurable, source.ErrTimeout, source.ErrMalformed} {
		t.Run(sentinel.Error(), func(t *testing.T) {
			h := newHarness(t)
			h.run(t, identA, gvRef)
			h.src.set(source.Reading{}, fmt.Errorf("%w: %s", sentinel, huge))
			_, err := h.client.StatsWorkload(context.Background(), &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
			st := status.Convert(err)
			if n := len(st.Message()); n > maxStatusMessage+64 || strings.ContainsRune(st.Message(), 0x1b) {
				t.Errorf("StatsWorkload status message %d bytes (raw ESC: %v)", n, strings.ContainsRune(st.Message(), 0x1b))
			}
			resp, err := h.client.StatsActiveWorkloads(context.Background(), &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			size := proto.Size(resp)
			if err != nil {
				size = proto.Size(status.Convert(err).Proto())
			}
			if size > 2*maxStatusMessage || strings.ContainsRune(resp.GetNoSampleDetail()+status.Convert(err).Message(), 0x1b) {
				t.Errorf("StatsActiveWorkloads answer is %d bytes", size)
			}
		})
	}
}

// TestLifecycleErrorNotPersisted: a state file that cannot be written is
// UNAVAILABLE STATE_NOT_PERSISTED when the disk is full, quota-bound or
// read-only (retry once writable), INTERNAL with the same reason otherwise:
// never a bare INTERNAL.
func TestLifecycleErrorNotPersisted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
		code  codes.Code
	}{
		{"disk full", syscall.ENOSPC, codes.Unavailable},
		{"quota", syscall.EDQUOT, codes.Unavailable},
		{"read-only", syscall.EROFS, codes.Unavailable},
		{"I/O error", syscall.EIO, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := lifecycleError(fmt.Errorf("%w: save ended.json in /var/lib/statsd: atomicfile: write: %w", identity.ErrNotPersisted, tc.cause))
			wantStatus(t, err, tc.code, sandboxstatsv1.ErrorReason_ERROR_REASON_STATE_NOT_PERSISTED)
			if !strings.Contains(status.Convert(err).Message(), tc.cause.Error()) {
				t.Errorf("message %q does not say why", status.Convert(err).Message())
			}
		})
	}
}

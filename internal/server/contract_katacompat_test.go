package server

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestMicroVMRefBothContainerForms: across a rolling upgrade a micro-VM's
// Run may carry container_ids (an older bridge, or a new one that also
// speaks to older statsds) and containers: either alone binds, both bind
// when they name the same ids in order (the named set is the one kept), and
// both disagreeing is INVALID_ARGUMENT INVALID_REQUEST naming the mismatch.
func TestMicroVMRefBothContainerForms(t *testing.T) {
	vm := func(ids []string, cs ...*sandboxstatsv1.ContainerRef) *sandboxstatsv1.SandboxRef {
		return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
			AgentAddress: "vsock://3:1024", ContainerIds: ids, Containers: cs}
	}
	for _, tc := range []struct {
		name string
		ref  *sandboxstatsv1.SandboxRef
		want []source.ContainerRef // nil: refused
		msg  string
	}{
		{"both agree (new bridge)", vm([]string{"sbx", "c1"}, cref("sbx", ""), cref("c1", "web")),
			[]source.ContainerRef{{ID: "sbx"}, {ID: "c1", Name: "web"}}, ""},
		{"container_ids only (old bridge)", vm([]string{"sbx", "c1"}),
			[]source.ContainerRef{{ID: "sbx"}, {ID: "c1"}}, ""},
		{"containers only", vm(nil, cref("sbx", ""), cref("c1", "web")),
			[]source.ContainerRef{{ID: "sbx"}, {ID: "c1", Name: "web"}}, ""},
		{"order differs", vm([]string{"c1", "sbx"}, cref("sbx", ""), cref("c1", "web")), nil,
			`container_ids[0] is "c1", containers[0].id is "sbx"`},
		{"an id missing", vm([]string{"sbx"}, cref("sbx", ""), cref("c1", "web")), nil,
			`containers[1] is "c1", container_ids has 1 ids`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, err := h.lifecycle.RunWorkload(context.Background(), &sandboxstatsv1.RunWorkloadRequest{Identity: identA, Sandbox: tc.ref})
			if tc.want == nil {
				wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST)
				if !strings.Contains(err.Error(), tc.msg) || h.store.Bound("actor-a") != nil {
					t.Fatalf("error %v does not name %q, or a binding was made", err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("RunWorkload: %v", err)
			}
			if diff := cmp.Diff(tc.want, h.store.Bound("actor-a").Activation.Containers()); diff != "" {
				t.Errorf("container set (-want +got):\n%s", diff)
			}
		})
	}
}

package lifecyclewire

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestKnowsEveryField fails when stats.proto gives a message this codec
// writes or reads by hand a field it does not know: a response's new field
// would be dropped by Marshal's epoch-only path, and a request's would send
// every real bind to proto's path (correct, but paying the descriptors
// again). Mend the codec, full() and the lists here together.
func TestKnowsEveryField(t *testing.T) {
	for _, tt := range []struct {
		m    proto.Message
		want []string // the fields the codec handles, in number order
	}{
		// Marshal writes field 1 and leaves an answer with replaced to proto.
		{&sandboxstatsv1.RunWorkloadResponse{}, []string{"epoch_unix_nano", "replaced"}},
		{&sandboxstatsv1.RestoreWorkloadResponse{}, []string{"epoch_unix_nano", "replaced"}},
		// decodeRequest, decodeIdentity, decodeSandbox, decodeContainer.
		{&sandboxstatsv1.RunWorkloadRequest{}, []string{"identity", "sandbox"}},
		{&sandboxstatsv1.RestoreWorkloadRequest{}, []string{"identity", "sandbox"}},
		{&sandboxstatsv1.WorkloadIdentity{}, []string{"actor_uid", "actor_name", "actor_namespace", "template_namespace", "template_name", "worker_pool"}},
		{&sandboxstatsv1.SandboxRef{}, []string{"sandbox_class", "cgroup_path", "sentry_pid", "agent_address", "container_ids", "vmm_pid", "vmm_pid_file", "qmp_socket", "containers"}},
		{&sandboxstatsv1.ContainerRef{}, []string{"id", "name"}},
	} {
		d := tt.m.ProtoReflect().Descriptor()
		t.Run(string(d.Name()), func(t *testing.T) {
			var got []string
			fs := d.Fields()
			for i := range fs.Len() {
				got = append(got, string(fs.Get(i).Name()))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("%s's fields changed (-known here +stats.proto): mend the codec (decode.go, Marshal) and full()\n%s", d.FullName(), diff)
			}
		})
	}
	// full() sets every field of the request (so TestUnmarshal's cases
	// reach each of them).
	var unset []string
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		fs := m.Descriptor().Fields()
		for i := range fs.Len() {
			f := fs.Get(i)
			if !m.Has(f) {
				unset = append(unset, string(f.FullName()))
				continue
			}
			switch {
			case f.IsList() && f.Message() != nil:
				walk(m.Get(f).List().Get(0).Message()) // the first of each list is the full one
			case f.Message() != nil:
				walk(m.Get(f).Message())
			}
		}
	}
	walk(full().ProtoReflect())
	if len(unset) > 0 {
		slices.Sort(unset)
		t.Errorf("full() leaves %q unset", unset)
	}
}

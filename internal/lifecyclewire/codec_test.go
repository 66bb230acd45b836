package lifecyclewire

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// full is a RunWorkloadRequest with every field set.
func full() *sandboxstatsv1.RunWorkloadRequest {
	return &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{
			ActorUid: "uid-1", ActorName: "actor", ActorNamespace: "ns", TemplateNamespace: "tns",
			TemplateName: "template", WorkerPool: "pool é",
		},
		Sandbox: &sandboxstatsv1.SandboxRef{
			SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, CgroupPath: "/kubepods/pod1",
			SentryPid: -7, AgentAddress: "vsock://3:1024", ContainerIds: []string{"a", "", "c"},
			VmmPid: math.MaxInt32, VmmPidFile: "/run/vmm.pid", QmpSocket: "/run/qmp.sock",
			Containers: []*sandboxstatsv1.ContainerRef{{Id: "a", Name: "app"}, {}, {Name: "side"}},
		},
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMarshal(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    proto.Message
	}{
		{"run, no epoch", &sandboxstatsv1.RunWorkloadResponse{}},
		{"run", &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: 1_765_000_000_123_456_789}},
		{"run, negative", &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: math.MinInt64}},
		{"run, max", &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: math.MaxInt64}},
		{"restore", &sandboxstatsv1.RestoreWorkloadResponse{EpochUnixNano: 1}},
		{"run, replaced (proto's)", &sandboxstatsv1.RunWorkloadResponse{EpochUnixNano: 5, Replaced: &sandboxstatsv1.EndedActivation{}}},
		{"another message (proto's)", &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Codec{}.Marshal(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(marshal(t, tt.m), got.Materialize(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Marshal (-proto.Marshal +got):\n%s", diff)
			}
		})
	}
}

func TestUnmarshal(t *testing.T) {
	fullBytes := marshal(t, full())
	tests := []struct {
		name string
		in   []byte
		hand bool // read by decodeRequest, not proto
	}{
		{"every field", fullBytes, true},
		{"empty", nil, true},
		{"empty identity and sandbox", marshal(t, &sandboxstatsv1.RunWorkloadRequest{
			Identity: &sandboxstatsv1.WorkloadIdentity{}, Sandbox: &sandboxstatsv1.SandboxRef{}}), true},
		{"an unknown field", appendString(append([]byte(nil), fullBytes...), 3, "x"), false},
		{"a message field twice (merged)", append(append([]byte(nil), fullBytes...), fullBytes...), false},
		{"a scalar field twice", marshalThen(t, &sandboxstatsv1.RunWorkloadRequest{}, 2,
			appendString(appendString(nil, 2, "/a"), 2, "/b")), false},
		{"another wire type", marshalThen(t, &sandboxstatsv1.RunWorkloadRequest{}, 2,
			protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1)), false},
		{"not UTF-8", marshalThen(t, &sandboxstatsv1.RunWorkloadRequest{}, 1, appendString(nil, 1, "\xff")), false},
		{"cut", fullBytes[:len(fullBytes)-1], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, ok := decodeRequest(tt.in); ok != tt.hand {
				t.Errorf("decodeRequest ok = %v, want %v", ok, tt.hand)
			}
			checkUnmarshal(t, tt.in)
		})
	}
}

// marshalThen is m's bytes with a field num holding inner's bytes.
func marshalThen(t testing.TB, m proto.Message, num protowire.Number, inner []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(marshal(t, m), num, protowire.BytesType), inner)
}

// appendString appends field num holding s.
func appendString(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

// checkUnmarshal decodes in with the codec and with proto, as both
// requests, and wants the same message or an error from both.
func checkUnmarshal(t *testing.T, in []byte) {
	t.Helper()
	for _, newMsg := range []func() proto.Message{
		func() proto.Message { return &sandboxstatsv1.RunWorkloadRequest{} },
		func() proto.Message { return &sandboxstatsv1.RestoreWorkloadRequest{} },
	} {
		// Two buffers, as grpc may hand a message over.
		data := mem.BufferSlice{mem.SliceBuffer(in[:len(in)/2]), mem.SliceBuffer(in[len(in)/2:])}
		got, want := newMsg(), newMsg()
		err := Codec{}.Unmarshal(data, got)
		wantErr := proto.Unmarshal(in, want)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("Unmarshal(%x) = %v, proto.Unmarshal = %v", in, err, wantErr)
		}
		if err != nil {
			continue
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Fatalf("Unmarshal(%x) (-proto.Unmarshal +got):\n%s", in, diff)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add(marshal(f, full()))
	f.Add([]byte{})
	f.Add(marshal(f, &sandboxstatsv1.RunWorkloadRequest{Sandbox: &sandboxstatsv1.SandboxRef{ContainerIds: []string{"x"}}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		checkUnmarshal(t, in)
	})
}

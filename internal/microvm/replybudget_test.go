package microvm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// mustMarshal is m on the wire.
func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// decodedMessages counts the messages within m as decoded: the ground truth
// countReply must reach on the wire without decoding.
func decodedMessages(m protoreflect.Message) int {
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			n += v.Map().Len()
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					n += 1 + decodedMessages(mv.Message()) // the value is a message within the entry
					return true
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				n += 1 + decodedMessages(v.List().Get(i).Message())
			}
		default:
			n += 1 + decodedMessages(v.Message())
		}
		return true
	})
	return n
}

// largestReadable is the largest reply statsd reads whole: 64 devices and
// 64 interfaces (convert's caps), 100 memory.stat keys, 256 CPUs.
func largestReadable() *katagrpc.StatsContainerResponse {
	r := kataagentfake.Bulky(100, maxDevices, maxInterfaces)
	r.CgroupStats.CpuStats.CpuUsage.PercpuUsage = make([]uint64, 256)
	for i := range r.CgroupStats.CpuStats.CpuUsage.PercpuUsage {
		r.CgroupStats.CpuStats.CpuUsage.PercpuUsage[i] = 1e12 + uint64(i) // 6 bytes each
	}
	return r
}

// repeatedField is n copies of field num with a varint value 0 (2 bytes
// each for num < 16), behind prefix.
func repeatedField(prefix []byte, num protowire.Number, typ protowire.Type, n int) []byte {
	b := prefix
	for range n {
		b = protowire.AppendTag(b, num, typ)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

// nestedGroups is depth groups (field 7) one within the other, fields
// varints at the bottom.
func nestedGroups(depth, fields int) []byte {
	var b []byte
	for range depth {
		b = protowire.AppendTag(b, 7, protowire.StartGroupType)
	}
	b = repeatedField(b, 1, protowire.VarintType, fields)
	for range depth {
		b = protowire.AppendTag(b, 7, protowire.EndGroupType)
	}
	return b
}

// nested wraps body as field num, a message on the wire, of each level
// from the innermost out.
func nested(body []byte, nums ...protowire.Number) []byte {
	for i := len(nums) - 1; i >= 0; i-- {
		body = protowire.AppendBytes(protowire.AppendTag(nil, nums[i], protowire.BytesType), body)
	}
	return body
}

// TestCountReply: the messages counted on the wire equal those decoded for
// ordinary replies and the largest readable one, which fits in the budget
// with room to spare; a reply over any count, or holding a group, is
// refused naming the field, each of them under the frame cap. From
// "131,000 unknown fields" on, what a second reviewer found passing a count
// of messages alone, each costing about as much to decode as 14,000 keys
// or (the groups, by the count's own scan) far more.
func TestCountReply(t *testing.T) {
	marshal := func(m proto.Message) []byte { return mustMarshal(t, m) }
	perCPU := func(n int) []byte { // cgroup_stats.cpu_stats.cpu_usage.percpu_usage, packed
		var packed []byte
		for range n {
			packed = protowire.AppendVarint(packed, 1)
		}
		return nested(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), packed), 1, 1, 1)
	}
	for _, tc := range []struct {
		name    string
		wire    []byte
		fits    replyBudget // the counts must be at most these
		refused string      // the error's words, "" if the reply fits
	}{
		{"ordinary v2", marshal(kataagentfake.V2(v2a)), replyBudget{100, 30, 30}, ""},
		{"ordinary v1 with a device and an interface", marshal(kataagentfake.V1(kataagentfake.Container{CPUTotal: 1,
			Devices: []kataagentfake.Device{{Major: 8, ReadBytes: 1}}, Network: []*katagrpc.NetworkStats{kataagentfake.Iface("eth0", 1, 1, 1, 1)}})), replyBudget{150, 30, 10}, ""},
		{"largest readable", marshal(largestReadable()), replyBudget{statsReplyBudget.fields / 2, statsReplyBudget.messages * 3 / 4, statsReplyBudget.mapEntries / 4}, ""},
		// Bulky's reply has 6 memory.stat keys and 2 huge page sizes of its own.
		{"map entries at the budget", marshal(kataagentfake.Bulky(statsReplyBudget.mapEntries-8, 0, 0)), statsReplyBudget, ""},
		{"one map entry over the budget", marshal(kataagentfake.Bulky(statsReplyBudget.mapEntries-7, 0, 0)), replyBudget{}, "over 512 map entries"},
		{"14,000 memory.stat keys", marshal(kataagentfake.Bulky(14_000, 0, 0)), replyBudget{}, "over 512 map entries (at grpc.MemoryStats.stats)"},
		{"110 devices in all eight lists", marshal(kataagentfake.Bulky(0, 110, 0)), replyBudget{}, "over 4096 messages"},
		{"5,000 interfaces", marshal(kataagentfake.Bulky(0, 0, 5_000)), replyBudget{}, "over 4096 messages (at grpc.StatsContainerResponse.network_stats)"},
		{"131,000 unknown fields", repeatedField(nil, 3, protowire.VarintType, 131_000), replyBudget{}, "over 32768 fields (at field 3 of grpc.StatsContainerResponse)"},
		{"a message field sent as 131,000 varints", repeatedField(nil, 1, protowire.VarintType, 131_000), replyBudget{}, "over 32768 fields (at grpc.StatsContainerResponse.cgroup_stats)"},
		{"a group of 80,000 fields", protowire.AppendTag(repeatedField(protowire.AppendTag(nil, 1, protowire.StartGroupType), 2, protowire.VarintType, 80_000), 1, protowire.EndGroupType),
			replyBudget{}, "a group (at grpc.StatsContainerResponse.cgroup_stats): no agent sends one"},
		// A second reviewer's: skipping nested groups rescans each level
		// (6-7 s a reply at this depth before groups were refused).
		{"groups 9,999 deep in a cgroup_stats", nested(nestedGroups(9_999, 22_000), 1), replyBudget{}, "a group (at field 7 of grpc.CgroupStats)"},
		{"an interface named 65,000 times", nested(func() []byte {
			var b []byte
			for range 65_000 {
				b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "e")
			}
			return b
		}(), 2), replyBudget{}, "over 32768 fields (at grpc.NetworkStats.name)"},
		{"per-CPU usage, 131,000 packed", perCPU(131_000), replyBudget{}, "over 32768 fields (at grpc.CpuUsage.percpu_usage)"},
		{"per-CPU usage, 256 packed", perCPU(256), replyBudget{300, 3, 0}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.wire) > maxAgentFrameBytes {
				t.Fatalf("the reply is %d bytes: the frame cap alone would refuse it", len(tc.wire))
			}
			n, err := countReply(tc.wire, statsReplyDescriptor, statsReplyBudget)
			t.Logf("%d bytes: %+v", len(tc.wire), n)
			if tc.refused != "" {
				if !errors.Is(err, errOverBudget) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err = %v, want errOverBudget and %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n.fields > tc.fits.fields || n.messages > tc.fits.messages || n.mapEntries > tc.fits.mapEntries {
				t.Errorf("counted %+v, want at most %+v", n, tc.fits)
			}
			var r katagrpc.StatsContainerResponse
			if err := proto.Unmarshal(tc.wire, &r); err != nil {
				t.Fatal(err)
			}
			if want := decodedMessages(r.ProtoReflect()); n.messages != want {
				t.Errorf("counted %d messages on the wire, %d decoded", n.messages, want)
			}
		})
	}
}

// TestEnvelopeBudget: ttrpc's Response around a payload holds a status and
// the payload; a status with many details is refused (ttrpc would decode
// them before any interceptor: 131,000 empty ones cost 43-50 ms and 32 MB).
func TestEnvelopeBudget(t *testing.T) {
	details := func(n int) *spb.Status {
		st := &spb.Status{Code: 13, Message: "agent: failed"}
		for range n {
			st.Details = append(st.Details, &anypb.Any{})
		}
		return st
	}
	for _, tc := range []struct {
		name    string
		resp    *ttrpc.Response
		refused string
	}{
		{"a payload", &ttrpc.Response{Payload: make([]byte, 200<<10)}, ""},
		{"an error status", &ttrpc.Response{Status: details(0)}, ""},
		{"an error status with 7 details", &ttrpc.Response{Status: details(7)}, ""},
		{"an error status with 8 details", &ttrpc.Response{Status: details(8)}, "over 8 messages (at google.rpc.Status.details)"},
		{"an error status with 100,000 details", &ttrpc.Response{Status: details(100_000)}, "over 8 messages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := countReply(mustMarshal(t, tc.resp), envelopeDescriptor, envelopeBudget)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatal(err)
			case tc.refused != "" && (!errors.Is(err, errOverBudget) || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("err = %v, want errOverBudget and %q", err, tc.refused)
			}
		})
	}
}

// TestOverBudgetRefusedUndecoded: through the real ttrpc client and the fake
// agent, a reply whose payload is over the budget is refused as malformed
// (the agent answered, wrongly) without cutting the connection, and polls
// read again on the same connection once the reply is ordinary. A status
// with too many details is refused by the frame guard, which cuts the
// connection: the envelope is ttrpc's, and ttrpc decodes it.
func TestOverBudgetRefusedUndecoded(t *testing.T) {
	hostile := kataagentfake.Bulky(14_000, 0, 0)
	var opts []kataagentfake.Option
	var ids []string
	for i := range 3 { // 25 are measured in e2e
		id := fmt.Sprintf("c%02d", i)
		ids = append(ids, id)
		opts = append(opts, kataagentfake.WithContainer(id, hostile))
	}
	agent := kataagentfake.New(t, t.TempDir(), opts...)
	cfg := testConfig()
	cfg.CallTimeout = 5 * time.Second // the fake encodes 14,000 keys a reply: slow under -race
	s := mustOpen(t, agent.Address(), cfg, ids...)
	_, err := s.Sample(context.Background())
	if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), "reply holds more than statsd decodes: over 512 map entries") {
		t.Fatalf("err = %v, want the replies refused for their map entries", err)
	}
	for _, id := range ids {
		agent.SetContainer(id, kataagentfake.V2(v2b))
	}
	sample(t, s)
	if d := agent.Dials(); d != 1 {
		t.Fatalf("%d dials: the connection was replaced, want it kept (the agent answered)", d)
	}

	st := &spb.Status{Code: 13, Message: "agent: failed"}
	for range 100_000 {
		st.Details = append(st.Details, &anypb.Any{})
	}
	for _, id := range ids {
		agent.SetContainerError(id, grpcstatus.ErrorProto(st))
	}
	_, err = s.Sample(context.Background())
	if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), "the agent sent a frame statsd refuses: the response on stream") ||
		!strings.Contains(err.Error(), "over 8 messages (at google.rpc.Status.details)") {
		t.Fatalf("err = %v, want the connection cut by the guard for the status details", err)
	}
	for _, id := range ids {
		agent.SetContainer(id, kataagentfake.V2(v2b))
	}
	pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
}

// FuzzCountReply: countReply never panics; on a reply the decoder accepts,
// the decoded messages are at most twice the count (the decoder merges a
// repeated singular message or map key, and gives a map entry sent without
// its value an empty one), exactly the count when the reply is its own
// re-encoding, and the fields counted at least the messages.
func FuzzCountReply(f *testing.F) {
	emptyValue := kataagentfake.V2(v2a)
	emptyValue.CgroupStats.HugetlbStats = map[string]*katagrpc.HugetlbStats{"2MB": {}}
	for _, r := range []*katagrpc.StatsContainerResponse{kataagentfake.V2(v2a), kataagentfake.Bulky(3, 2, 2), {}, emptyValue} {
		f.Add(mustMarshal(f, r))
	}
	// A hugetlb_stats entry of a key alone: the decoder makes its value.
	f.Add([]byte{0x0a, 0x07, 0x2a, 0x05, 0x0a, 0x03, '2', 'M', 'B'})
	// A group holding a varint, then an unknown field; groups 3 deep.
	f.Add([]byte{0x0b, 0x10, 0x01, 0x0c, 0x18, 0x05})
	f.Add(nestedGroups(3, 2))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := countReply(b, statsReplyDescriptor, statsReplyBudget)
		if n.fields < n.messages || n.messages < n.mapEntries {
			t.Fatalf("counts %+v", n)
		}
		var r katagrpc.StatsContainerResponse
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if err != nil {
			if !errors.Is(err, errOverBudget) {
				t.Fatalf("err %v on a decodable reply", err)
			}
			return
		}
		// The count bounds the decoder's work: each message counted makes
		// at most one more (a map entry sent without its value gets an
		// empty one).
		if want := decodedMessages(r.ProtoReflect()); want > 2*n.messages {
			t.Fatalf("counted %d, decoded %d", n.messages, want)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := countReply(again, statsReplyDescriptor, statsReplyBudget); err != nil || m.messages != decodedMessages(r.ProtoReflect()) {
			t.Fatalf("re-encoded: counted %+v, %v; decoded %d", m, err, decodedMessages(r.ProtoReflect()))
		}
	})
}

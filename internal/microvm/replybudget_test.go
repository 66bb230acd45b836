package microvm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// decodedMessages counts the messages within m as decoded: the ground truth
// countMessages must reach on the wire without decoding.
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
// 64 interfaces (convert's caps), 100 memory.stat keys.
func largestReadable() *katagrpc.StatsContainerResponse {
	return kataagentfake.Bulky(100, maxDevices, maxInterfaces)
}

// TestCountMessages: the count on the wire equals the decoded count for
// ordinary and for the largest readable replies, which fit in the budget
// with room to spare; a reply over either count does not, though it fits
// in the frame cap.
func TestCountMessages(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reply   *katagrpc.StatsContainerResponse
		atMost  int    // the count must be at most this
		refused string // the error's words, "" if the reply fits
	}{
		{"ordinary v2", kataagentfake.V2(v2a), 100, ""},
		{"ordinary v1 with a device and an interface", kataagentfake.V1(kataagentfake.Container{CPUTotal: 1,
			Devices: []kataagentfake.Device{{Major: 8, ReadBytes: 1}}, Network: []*katagrpc.NetworkStats{kataagentfake.Iface("eth0", 1, 1, 1, 1)}}), 100, ""},
		{"largest readable", largestReadable(), maxReplyMessages * 3 / 4, ""},
		// Bulky's reply has 6 memory.stat keys and 2 huge page sizes of its own.
		{"map entries at the budget", kataagentfake.Bulky(maxReplyMapEntries-8, 0, 0), maxReplyMapEntries + 20, ""},
		{"one map entry over the budget", kataagentfake.Bulky(maxReplyMapEntries-7, 0, 0), 0, "over 512 map entries"},
		{"14,000 memory.stat keys", kataagentfake.Bulky(14_000, 0, 0), 0, "over 512 map entries"},
		{"110 devices in all eight lists", kataagentfake.Bulky(0, 110, 0), 0, "over 4096"},
		{"5,000 interfaces", kataagentfake.Bulky(0, 0, 5_000), 0, "over 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.Marshal(tc.reply)
			if err != nil {
				t.Fatal(err)
			}
			n, err := countMessages(b, statsReplyDescriptor, defaultReplyBudget)
			t.Logf("%d bytes, %d messages counted", len(b), n)
			if tc.refused != "" {
				if !errors.Is(err, errTooManyMessages) || !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err = %v, want errTooManyMessages, ErrMalformed and %q", err, tc.refused)
				}
				if len(b) > maxAgentFrameBytes {
					t.Fatalf("the reply is %d bytes: the frame cap alone would refuse it", len(b))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := decodedMessages(tc.reply.ProtoReflect()); n != want {
				t.Errorf("counted %d messages on the wire, %d decoded", n, want)
			}
			if n > tc.atMost {
				t.Errorf("%d messages, want at most %d", n, tc.atMost)
			}
		})
	}
}

// TestTooManyMessagesRefusedUndecoded: through the real ttrpc client and
// the fake agent, a reply over the cap is refused as malformed (the agent
// answered, wrongly) without cutting the connection, and polls read again
// on the same connection once the reply is ordinary.
func TestTooManyMessagesRefusedUndecoded(t *testing.T) {
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
	if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), "more messages than statsd decodes") {
		t.Fatalf("err = %v, want the replies refused for their message count", err)
	}
	for _, id := range ids {
		agent.SetContainer(id, kataagentfake.V2(v2b))
	}
	sample(t, s)
	if d := agent.Dials(); d != 1 {
		t.Fatalf("%d dials: the connection was replaced, want it kept (the agent answered)", d)
	}
}

// FuzzCountMessages: countMessages never panics; on a reply the decoder
// accepts, the decoded messages are at most twice the count (the decoder
// merges a repeated singular message or map key, and gives a map entry
// sent without its value an empty one), and exactly the count when the
// reply is its own re-encoding.
func FuzzCountMessages(f *testing.F) {
	emptyValue := kataagentfake.V2(v2a)
	emptyValue.CgroupStats.HugetlbStats = map[string]*katagrpc.HugetlbStats{"2MB": {}}
	for _, r := range []*katagrpc.StatsContainerResponse{kataagentfake.V2(v2a), kataagentfake.Bulky(3, 2, 2), {}, emptyValue} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// A hugetlb_stats entry of a key alone: the decoder makes its value.
	f.Add([]byte{0x0a, 0x07, 0x2a, 0x05, 0x0a, 0x03, '2', 'M', 'B'})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := countMessages(b, statsReplyDescriptor, defaultReplyBudget)
		var r katagrpc.StatsContainerResponse
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if err != nil {
			if !errors.Is(err, errTooManyMessages) {
				t.Fatalf("err %v on a decodable reply", err)
			}
			return
		}
		// The count bounds the decoder's work: each message counted makes
		// at most one more (a map entry sent without its value gets an
		// empty one).
		if want := decodedMessages(r.ProtoReflect()); want > 2*n {
			t.Fatalf("counted %d, decoded %d", n, want)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := countMessages(again, statsReplyDescriptor, defaultReplyBudget); err != nil || m != decodedMessages(r.ProtoReflect()) {
			t.Fatalf("re-encoded: counted %d, %v; decoded %d", m, err, decodedMessages(r.ProtoReflect()))
		}
	})
}

package microvm

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// BenchmarkAgentSample compares a micro-VM read with a bare ttrpc
// StatsContainer round trip to the same fake agent over its Unix socket
// (baseline): persistent is Source.Sample of one container on the kept
// connection; dial-per-poll opens a new connection, with the hybrid-vsock
// handshake and the Version call, for every poll.
func BenchmarkAgentSample(b *testing.B) {
	agent := kataagentfake.New(b, b.TempDir(), kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	cfg := Config{CallTimeout: 5 * time.Second}
	ctx := context.Background()

	b.Run("baseline", func(b *testing.B) {
		c, err := agent.DialBare(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		b.ReportAllocs()
		for b.Loop() {
			cctx, cancel := context.WithTimeout(ctx, cfg.CallTimeout)
			if _, err := c.StatsContainer(cctx, "a"); err != nil {
				b.Fatal(err)
			}
			cancel()
		}
	})
	b.Run("persistent", func(b *testing.B) {
		s := mustOpen(b, agent.Address(), cfg, "a")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Sample(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dial-per-poll", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s, err := open(testRef(agent.Address(), "a"), cfg)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Sample(ctx); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}

// BenchmarkHostileReply is statsd's cost of one container's reply, counted
// and then decoded if it fits (what the client does now), against an
// ordinary reply's decode (baseline): the largest reply read whole, the
// most a reply within the budget can hold (all map entries; all fields as
// unknown varints), and replies over it: 14,000 memory.stat keys decoded
// (before the budget) and refused, 131,000 unknown fields refused, and
// groups 9,999 deep decoded and refused.
func BenchmarkHostileReply(b *testing.B) {
	marshal := func(m proto.Message) []byte { return mustMarshal(b, m) }
	keys := marshal(kataagentfake.Bulky(14_000, 0, 0))
	for _, bc := range []struct {
		name string
		wire []byte
		read func([]byte) error
	}{
		{"baseline", marshal(kataagentfake.V2(v2a)), decodeReply},
		{"ordinary-counted", marshal(kataagentfake.V2(v2a)), countAndDecode},
		{"largest-readable", marshal(largestReadable()), countAndDecode},
		{"map-entries-at-budget", marshal(kataagentfake.Bulky(statsReplyBudget.mapEntries-8, 0, 0)), countAndDecode},
		{"fields-at-budget", repeatedField(nil, 3, protowire.VarintType, statsReplyBudget.fields), countAndDecode},
		{"14000-keys-decoded", keys, decodeReply},
		{"14000-keys-refused", keys, countAndDecode},
		{"131000-fields-refused", repeatedField(nil, 3, protowire.VarintType, 131_000), countAndDecode},
		{"nested-groups-decoded", nested(nestedGroups(9_999, 22_000), 1), decodeReply},
		{"nested-groups-refused", nested(nestedGroups(9_999, 22_000), 1), countAndDecode},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.read(bc.wire)
			}
		})
	}
}

func decodeReply(b []byte) error {
	var r katagrpc.StatsContainerResponse
	return proto.Unmarshal(b, &r)
}

func countAndDecode(b []byte) error {
	if _, err := countReply(b, statsReplyDescriptor, statsReplyBudget); err != nil {
		return err
	}
	return decodeReply(b)
}

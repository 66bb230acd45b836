package microvm

import (
	"context"
	"testing"
	"time"

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

// BenchmarkHostileReply is statsd's cost of one container's reply of
// 14,000 memory.stat keys (just under the frame cap): decode is what the
// ttrpc client spent on it before the message budget (and what it spends
// on any reply the budget lets through); refuse is what it spends now; an
// ordinary reply's decode is the baseline.
func BenchmarkHostileReply(b *testing.B) {
	hostile := kataagentfake.Bulky(14_000, 0, 0)
	wire, err := proto.Marshal(hostile)
	if err != nil {
		b.Fatal(err)
	}
	ordinary, err := proto.Marshal(kataagentfake.V2(v2a))
	if err != nil {
		b.Fatal(err)
	}
	largest, err := proto.Marshal(largestReadable())
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		wire []byte
		read func([]byte) error
	}{
		{"baseline", ordinary, decodeReply},
		{"ordinary-counted", ordinary, countAndDecode},
		{"largest-readable", largest, countAndDecode},
		{"hostile-decoded", wire, decodeReply},
		{"hostile-refused", wire, countAndDecode},
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
	if _, err := countMessages(b, statsReplyDescriptor, defaultReplyBudget); err != nil {
		return err
	}
	return decodeReply(b)
}

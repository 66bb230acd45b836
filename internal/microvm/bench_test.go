package microvm

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
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

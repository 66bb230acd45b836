package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationHostileAgentHugeErrors: a guest agent answering
// StatsContainer for each of 25 containers with a huge error message (ending
// in a terminal title escape). Before: one poll drove statsd to about 1 GB,
// drift.json to 36 MB, log lines to 12 MB. statsd must stay under 64 MiB
// over 4 concurrent pollers, every answer and log line under 64 KiB, no raw
// ESC anywhere, drift.json small.
func TestIntegrationHostileAgentHugeErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary against a hostile agent")
	}
	bin := testenv.BuildBinaries(t)
	for _, tc := range []struct {
		name string
		size int
	}{
		{"4MB error (over the agent frame cap)", 4_000_000},
		{"200KiB error (cut where it enters)", 200 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			huge := strings.Repeat("E", tc.size) + "\x1b]0;pwned\x07"
			var opts []kataagentfake.Option
			var ids []string
			for i := range 25 {
				id := fmt.Sprintf("ctr-%02d", i)
				ids = append(ids, id)
				opts = append(opts, kataagentfake.WithContainerError(id, status.Error(codes.Internal, huge)))
			}
			agent := kataagentfake.New(t, t.TempDir(), opts...)
			d, stats, life := statsdOnAgent(t, bin, agent.Address(), ids...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var a answers
			start := time.Now()
			pollConcurrently(4, 6, func(ctx context.Context) {
				r1, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm", IncludeHost: true})
				a.note("StatsWorkload", r1, err, strings.Repeat("E", 1024))
				r2, err := stats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
				a.note("StatsActiveWorkloads", r2, err, strings.Repeat("E", 1024))
				r3, err := stats.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
				a.note("ListDriftFindings", r3, err, strings.Repeat("E", 1024))
			})
			elapsed := time.Since(start)
			time.Sleep(500 * time.Millisecond) // a few more drift cycles
			// The end of the activation: its final read fails with the
			// agent's errors, and the record travels in every discovery
			// answer.
			e, err := life.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-vm"})
			a.note("CheckpointWorkload", e, err, strings.Repeat("E", 1024))
			r, err := stats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			a.note("StatsActiveWorkloads after the end", r, err, strings.Repeat("E", 1024))
			rss := peakRSS(t, d)
			a.check(t)
			if rss > maxRSSBytes {
				t.Errorf("statsd peak RSS %d MiB, want under %d MiB", rss>>20, maxRSSBytes>>20)
			}
			fi, err := os.Stat(filepath.Join(d.StateDir, "drift.json"))
			var driftSize int64
			if err == nil {
				driftSize = fi.Size()
			}
			if driftSize > maxDriftFileSize {
				t.Errorf("drift.json is %d bytes, want under %d", driftSize, maxDriftFileSize)
			}
			logSize, lines := checkLog(t, d.Log)
			t.Logf("measured: %d answers (%d errors) in %v, largest %d bytes; statsd peak RSS %.1f MiB; drift.json %d bytes; log %d bytes in %d lines",
				a.n, a.errs, elapsed.Round(time.Millisecond), a.largest, float64(rss)/(1<<20), driftSize, logSize, lines)
		})
	}
}

// TestIntegrationHostileAgentFloodsInactiveStreams: an agent streaming
// frames on stream ids no call opened. Before: 85 MB of "received message on
// inactive stream" logs and 7.6 s of statsd CPU in 10 s. The connection is
// cut at the first such frame and redialled after a growing backoff; the log
// and the CPU stay small.
func TestIntegrationHostileAgentFloodsInactiveStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary against a hostile agent")
	}
	bin := testenv.BuildBinaries(t)
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.FloodInactiveStreams, kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20}))
	d, stats, _ := statsdOnAgent(t, bin, h.Address(), "web")
	cpu0, start := cpuTime(t, d), time.Now()
	const window = 5 * time.Second
	var a answers
	pollConcurrently(4, int(window/(100*time.Millisecond)), func(ctx context.Context) {
		r, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm"})
		a.note("StatsWorkload", r, err)
		time.Sleep(100 * time.Millisecond)
	})
	cpu, elapsed := cpuTime(t, d)-cpu0, time.Since(start)
	a.check(t)
	logSize, lines := checkLog(t, d.Log)
	t.Logf("measured over %v: statsd CPU %v, log %d bytes in %d lines, %d agent dials, %d frames flooded, peak RSS %.1f MiB",
		elapsed.Round(time.Millisecond), cpu, logSize, lines, h.Dials(), h.Flooded(), float64(peakRSS(t, d))/(1<<20))
	if logSize > 256<<10 {
		t.Errorf("log grew to %d bytes in %v", logSize, elapsed)
	}
	if cpu > elapsed/5 {
		t.Errorf("statsd used %v of CPU in %v", cpu, elapsed)
	}
	if rss := peakRSS(t, d); rss > maxRSSBytes {
		t.Errorf("peak RSS %d MiB", rss>>20)
	}
}

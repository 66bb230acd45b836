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
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
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
			d, stats, life := statsdOnAgent(t, bin, driftEvery200ms, agent.Address(), ids...)
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
	d, stats, _ := statsdOnAgent(t, bin, driftEvery200ms, h.Address(), "web")
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

// TestIntegrationHostileAgentManyEntries: a guest agent swelling each of 25
// containers' replies, under the 256 KiB frame cap. Before: 14,000
// memory.stat keys a reply cost about 240 ms of statsd CPU per poll (3.5 ms
// for an ordinary guest), every reply decoded. Now a reply holding more
// fields, messages or map entries than any agent sends is refused undecoded
// (the poll answers, the reason says why), so is one holding a group (no
// agent sends one), and one at the budget costs about what the largest
// reply statsd reads whole costs.
func TestIntegrationHostileAgentManyEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary against a hostile agent")
	}
	bin := testenv.BuildBinaries(t)
	unknownFields := func(n int) *katagrpc.StatsContainerResponse {
		// n unknown varint fields beside an ordinary reply: the decoder
		// keeps each one.
		r := kataagentfake.V2(kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 1e9})
		var raw []byte
		for range n {
			raw = protowire.AppendVarint(protowire.AppendTag(raw, 15, protowire.VarintType), 0)
		}
		r.ProtoReflect().SetUnknown(raw)
		return r
	}
	nestedGroups := func(depth int) *katagrpc.StatsContainerResponse {
		// Groups within groups in cgroup_stats: skipping them rescans
		// each level (6-7 s a reply, 9,999 deep).
		r := kataagentfake.V2(kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 1e9})
		var raw []byte
		for range depth {
			raw = protowire.AppendTag(raw, 7, protowire.StartGroupType)
		}
		raw = protowire.AppendVarint(protowire.AppendTag(raw, 1, protowire.VarintType), 0)
		for range depth {
			raw = protowire.AppendTag(raw, 7, protowire.EndGroupType)
		}
		r.CgroupStats.ProtoReflect().SetUnknown(raw)
		return r
	}
	perPoll := map[string]time.Duration{}
	for _, tc := range []struct {
		name    string
		reply   *katagrpc.StatsContainerResponse
		refused string // the reason's words; "" if the replies are read
	}{
		{"ordinary", kataagentfake.V2(kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 1e9}), ""},
		// 64 devices in all eight blkio lists, 64 interfaces, 100 keys.
		{"largest readable", kataagentfake.Bulky(100, 64, 64), ""},
		{"map entries at the budget", kataagentfake.Bulky(504, 0, 0), ""},
		{"fields at the budget", unknownFields(32_000), ""},
		{"14,000 keys", kataagentfake.Bulky(14_000, 0, 0), "over 512 map entries"},
		{"100,000 unknown fields", unknownFields(100_000), "over 32768 fields"},
		{"groups 9,999 deep", nestedGroups(9_999), "a group (at field 7 of grpc.CgroupStats)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []kataagentfake.Option
			var ids []string
			for i := range 25 {
				id := fmt.Sprintf("ctr-%02d", i)
				ids = append(ids, id)
				opts = append(opts, kataagentfake.WithContainer(id, tc.reply))
			}
			agent := kataagentfake.New(t, t.TempDir(), opts...)
			// No drift check: each poll is then the only read of the agent;
			// a read timeout no loaded machine reaches.
			d, stats, _ := statsdOnAgent(t, bin, []string{"--drift-interval", "0", "--read-timeout", "10s"}, agent.Address(), ids...)
			poll := func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				_, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm"})
				switch {
				case tc.refused == "" && err != nil:
					t.Fatalf("err = %v, want the replies read", err)
				case tc.refused != "" && (status.Code(err) == codes.OK || !strings.Contains(err.Error(), "reply holds more than statsd decodes: "+tc.refused)):
					t.Fatalf("err = %v, want the replies refused: %s", err, tc.refused)
				}
			}
			poll() // the dial and the version call
			// The least CPU of three windows of 10 polls: CPU is counted in
			// 10 ms ticks, so 1 ms a poll; the least is what the reads cost,
			// the rest the machine's noise.
			perPoll[tc.name] = time.Hour
			for range 3 {
				before := cpuTime(t, d)
				for range 10 {
					poll()
				}
				perPoll[tc.name] = min(perPoll[tc.name], (cpuTime(t, d)-before)/10)
			}
			t.Logf("measured: statsd CPU %v per poll", perPoll[tc.name])
			if d := agent.Dials(); d != 1 {
				t.Errorf("%d dials: the agent answered, its connection should be kept", d)
			}
		})
	}
	if t.Failed() {
		return
	}
	largest := perPoll["largest readable"]
	for _, name := range []string{"map entries at the budget", "fields at the budget"} {
		if bound := 3*largest + 20*time.Millisecond; perPoll[name] > bound {
			t.Errorf("statsd CPU per poll with %s: %v, want at most %v (about the largest readable reply's, %v)", name, perPoll[name], bound, largest)
		}
	}
	for _, name := range []string{"14,000 keys", "100,000 unknown fields", "groups 9,999 deep"} {
		if bound := largest + 20*time.Millisecond; perPoll[name] > bound {
			t.Errorf("statsd CPU per poll refusing %s: %v, want at most %v (the largest readable reply's)", name, perPoll[name], bound)
		}
	}
}

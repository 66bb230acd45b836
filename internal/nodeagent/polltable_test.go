package nodeagent

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func TestWritePollTableGolden(t *testing.T) {
	measured := sample("actor-1", 12_345_678, 300<<20)
	measured.SourceDetail = "cgroup v1 /sys/fs/cgroup/memory/statstest/pause"
	noPeak := sample("actor-2", 250_000, 20<<20)
	noPeak.SandboxClass = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM
	noPeak.Source = sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
	noPeak.MemoryPeakBytes = nil
	unmeasured := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "actor-3", SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR}
	results := []sweep.DaemonResult{
		{Socket: "/run/statsd/a.sock", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{measured}},
		{Socket: "/run/statsd/b.sock", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{noPeak}},
		{Socket: "/run/statsd/c.sock", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{unmeasured}},
		{Socket: "/run/statsd/d.sock", Status: sweep.StatusNoSample, NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD},
		{Socket: "/run/statsd/e.sock", Status: sweep.StatusNoSample, NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET, NoSampleDetail: "sandbox cgroup not created yet"},
		{Socket: "/run/statsd/f.sock", Status: sweep.StatusError, Code: codes.DeadlineExceeded,
			Err: wrapPoll("/run/statsd/f.sock", status.Error(codes.DeadlineExceeded, "context deadline exceeded"))},
		{Socket: "/run/statsd/g.sock", Status: sweep.StatusVanished, Code: codes.Unavailable,
			Err: wrapPoll("/run/statsd/g.sock", status.Error(codes.Unavailable, "connection error: no such file or directory"))},
	}
	var b bytesBuffer
	if err := WritePollTable(&b, results); err != nil {
		t.Fatal(err)
	}
	golden(t, "poll.table.golden", b.Bytes())
}

func wrapPoll(sock string, err error) error { return fmt.Errorf("sweep: poll %s: %w", sock, err) }

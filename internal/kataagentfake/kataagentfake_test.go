package kataagentfake_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// Calls counts every request from the wire, including a method the fake does
// not serve (ttrpc answers Unimplemented before any handler runs): what lets
// a test prove a client never called GetOOMEvent.
func TestCallsCountsEveryMethod(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(kataagentfake.Container{})))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := agent.DialBare(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if _, err := c.StatsContainer(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	var empty katagrpc.CheckRequest
	err = c.Call(ctx, "grpc.AgentService", "GetOOMEvent", &empty, &katagrpc.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetOOMEvent: %v; want Unimplemented from the fake", err)
	}
	if err := c.Call(ctx, "grpc.Health", "Version", &empty, &katagrpc.VersionCheckResponse{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"/grpc.AgentService/StatsContainer": 3,
		"/grpc.AgentService/GetOOMEvent":    1,
		"/grpc.Health/Version":              1,
	}
	if diff := cmp.Diff(want, agent.Calls()); diff != "" {
		t.Errorf("Calls (-want +got):\n%s", diff)
	}
}

func entries(es ...*katagrpc.BlkioStatsEntry) []*katagrpc.BlkioStatsEntry { return es }

func e(major, minor uint64, op string, v uint64) *katagrpc.BlkioStatsEntry {
	return &katagrpc.BlkioStatsEntry{Major: major, Minor: minor, Op: op, Value: v}
}

// The builders lay block IO out as the Rust agent does for each guest.
func TestBlkioLayout(t *testing.T) {
	dev := kataagentfake.Device{Major: 254, Minor: 0, ReadBytes: 4096, WriteBytes: 8192, ReadIOs: 1, WriteIOs: 2, DiscardBytes: 7, DiscardIOs: 3}
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
		want  *katagrpc.BlkioStats
	}{
		{
			name:  "v2: io.stat in io_service_bytes_recursive only",
			reply: kataagentfake.V2(kataagentfake.Container{Devices: []kataagentfake.Device{dev}}),
			want: &katagrpc.BlkioStats{IoServiceBytesRecursive: entries(e(254, 0, "read", 4096), e(254, 0, "write", 8192),
				e(254, 0, "rios", 1), e(254, 0, "wios", 2), e(254, 0, "dbytes", 7), e(254, 0, "dios", 3))},
		},
		{
			name:  "v1, title case as the kernel spells it",
			reply: kataagentfake.V1(kataagentfake.Container{Devices: []kataagentfake.Device{dev}, TitleCaseOps: true}),
			want: &katagrpc.BlkioStats{
				IoServiceBytesRecursive: entries(e(254, 0, "Read", 4096), e(254, 0, "Write", 8192), e(254, 0, "Sync", 8192), e(254, 0, "Async", 4096), e(254, 0, "Total", 12288)),
				IoServicedRecursive:     entries(e(254, 0, "Read", 1), e(254, 0, "Write", 2), e(254, 0, "Sync", 2), e(254, 0, "Async", 1), e(254, 0, "Total", 3)),
			},
		},
		{
			name:  "no IO: blkio_stats with no entries",
			reply: kataagentfake.V2(kataagentfake.Container{}),
			want:  &katagrpc.BlkioStats{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.reply.GetCgroupStats().GetBlkioStats(), protocmp.Transform()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSignalDefaults(t *testing.T) {
	r := kataagentfake.V2(kataagentfake.Container{})
	cg := r.GetCgroupStats()
	if cg.GetPidsStats().GetCurrent() != 1 || cg.GetPidsStats().GetLimit() != 0 || cg.GetCpuStats().GetThrottlingData() == nil || len(r.GetNetworkStats()) != 0 {
		t.Fatalf("defaults: pids %v throttling %v network %v; want 1 task, no pids limit, zero throttling, no network_stats",
			cg.GetPidsStats(), cg.GetCpuStats().GetThrottlingData(), r.GetNetworkStats())
	}
	r = kataagentfake.V1(kataagentfake.Container{NoThrottling: true, NoPids: true})
	if r.GetCgroupStats().GetPidsStats() != nil || r.GetCgroupStats().GetCpuStats().GetThrottlingData() != nil {
		t.Fatal("NoThrottling / NoPids left the messages in")
	}
}

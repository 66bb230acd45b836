package microvm

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

var (
	agent420 = parseAgentVersion("4.2.0", "0.0.1")
	agent430 = parseAgentVersion("4.3.0", "0.0.1")
)

func limited(v uint64) *source.Limit { return &source.Limit{Value: v} }

var unlimited = &source.Limit{Unlimited: true}

// with edits a scripted reply in place and returns it.
func with(r *katagrpc.StatsContainerResponse, edit func(*katagrpc.StatsContainerResponse)) *katagrpc.StatsContainerResponse {
	edit(r)
	return r
}

func TestConvertSignals(t *testing.T) {
	throttled := kataagentfake.Container{Periods: 500, ThrottledPeriods: 400, ThrottledNanos: 8_000_000_123}
	dev := kataagentfake.Device{Major: 254, Minor: 0, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512, DiscardBytes: 9, DiscardIOs: 9}
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
		v     agentVersion
		want  containerSignals
	}{
		{
			name:  "v2 defaults: u64::MAX limit is unlimited, pids.max 0 is unlimited, no network, no blkio rows",
			reply: kataagentfake.V2(kataagentfake.Container{}),
			v:     agent430,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v1: 2^63 page-rounded limit is unlimited",
			reply: kataagentfake.V1(kataagentfake.Container{}),
			v:     agent410,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "a 64 MiB limit, 2^62 is still a limit, pids.max 100",
			reply: kataagentfake.V1(kataagentfake.Container{LimitBytes: 64 << 20, Pids: 7, PidsLimit: 100}),
			v:     agent410,
			want: containerSignals{MemoryLimit: limited(64 << 20), Throttling: &containerThrottling{ThrottledKnown: true},
				Pids: &source.Pids{Current: 7, Limit: limited(100)}},
		},
		{
			name:  "exactly 2^62 is a limit, one above is not",
			reply: kataagentfake.V2(kataagentfake.Container{LimitBytes: 1 << 62}),
			v:     agent410,
			want: containerSignals{MemoryLimit: limited(1 << 62), Throttling: &containerThrottling{ThrottledWhy: `agent "4.1.0" reads cpu.stat throttled_time`},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "limit 0: the agent could not read it",
			reply: with(kataagentfake.V1(kataagentfake.Container{}), func(r *katagrpc.StatsContainerResponse) { r.CgroupStats.MemoryStats.Usage.Limit = 0 }),
			v:     agent410,
			want: containerSignals{LimitWhy: "the agent sent memory limit 0", Throttling: &containerThrottling{ThrottledKnown: true},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v1 guest, old agent: throttled_time ns to us",
			reply: kataagentfake.V1(throttled),
			v:     agent382,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 500, ThrottledPeriods: 400, ThrottledUsec: 8_000_000, ThrottledKnown: true},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v2 guest, agent 4.1.0: throttled time absent (issue 13851), periods kept",
			reply: kataagentfake.V2(kataagentfake.Container{Periods: 500, ThrottledPeriods: 400}),
			v:     agent410,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 500, ThrottledPeriods: 400, ThrottledWhy: "kata issue 13851"},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v2 guest, agent 4.2.0 still has the bug",
			reply: kataagentfake.V2(kataagentfake.Container{Periods: 500, ThrottledPeriods: 400}),
			v:     agent420,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 500, ThrottledPeriods: 400, ThrottledWhy: `agent "4.2.0"`},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v2 guest, fixed agent 4.3.0: throttled_usec x1000 on the wire, back to us",
			reply: kataagentfake.V2(throttled),
			v:     agent430,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 500, ThrottledPeriods: 400, ThrottledUsec: 8_000_000, ThrottledKnown: true},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name:  "v2 guest, agent version unknown: unfixed until shown otherwise",
			reply: kataagentfake.V2(throttled),
			v:     agentDev,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 500, ThrottledPeriods: 400, ThrottledWhy: "not a release number"},
				Pids: &source.Pids{Current: 1, Limit: unlimited}},
		},
		{
			name: "guest version unknown, agent 4.1.0",
			reply: &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{
				CpuStats:    &katagrpc.CpuStats{CpuUsage: &katagrpc.CpuUsage{}, ThrottlingData: &katagrpc.ThrottlingData{Periods: 3}},
				MemoryStats: &katagrpc.MemoryStats{Usage: &katagrpc.MemoryData{Limit: math.MaxUint64}},
			}},
			v:    agent410,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{Periods: 3, ThrottledWhy: "cannot be told"}},
		},
		{
			name:  "no cpu or pids controller: no throttling_data, no pids_stats",
			reply: kataagentfake.V2(kataagentfake.Container{NoThrottling: true, NoPids: true}),
			v:     agent430,
			want:  containerSignals{MemoryLimit: unlimited},
		},
		{
			name: "network_stats by name: a duplicate keeps the larger counters, nameless dropped",
			reply: kataagentfake.V2(kataagentfake.Container{Network: []*katagrpc.NetworkStats{
				kataagentfake.Iface("eth0", 100, 1, 200, 2), kataagentfake.Iface("lo", 5, 5, 5, 5),
				kataagentfake.Iface("eth0", 90, 3, 250, 1), kataagentfake.Iface("", 1, 1, 1, 1), nil,
			}}),
			v: agent430,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true}, Pids: &source.Pids{Current: 1, Limit: unlimited},
				Network: []source.InterfaceCounters{
					{Name: "eth0", RxBytes: 100, RxPackets: 3, TxBytes: 250, TxPackets: 2},
					{Name: "lo", RxBytes: 5, RxPackets: 5, TxBytes: 5, TxPackets: 5},
				}},
		},
		{
			name:  "blkio v2: io.stat rbytes/wbytes/rios/wios, discards ignored",
			reply: kataagentfake.V2(kataagentfake.Container{Devices: []kataagentfake.Device{dev, {Major: 8, Minor: 16, WriteBytes: 1, WriteIOs: 1}}}),
			v:     agent430,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true}, Pids: &source.Pids{Current: 1, Limit: unlimited},
				BlockIO: blockIOResult{Layout: "v2", IO: &source.BlockIO{ReadBytes: 4096, WriteBytes: 64<<20 + 1, ReadIOs: 1, WriteIOs: 513,
					Devices: []source.DeviceIO{{Major: 8, Minor: 16, WriteBytes: 1, WriteIOs: 1}, {Major: 254, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512}}}}},
		},
		{
			name:  "blkio v1, ops in the kernel's title case",
			reply: kataagentfake.V1(kataagentfake.Container{Devices: []kataagentfake.Device{dev}, TitleCaseOps: true}),
			v:     agent410,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true}, Pids: &source.Pids{Current: 1, Limit: unlimited},
				BlockIO: blockIOResult{Layout: "v1", IO: &source.BlockIO{ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512,
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512}}}}},
		},
		{
			name:  "blkio v1, the Rust agent's lower case",
			reply: kataagentfake.V1(kataagentfake.Container{Devices: []kataagentfake.Device{dev}}),
			v:     agent410,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true}, Pids: &source.Pids{Current: 1, Limit: unlimited},
				BlockIO: blockIOResult{Layout: "v1", IO: &source.BlockIO{ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512,
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 512}}}}},
		},
		{
			name: "blkio device number beyond 32 bits: malformed",
			reply: with(kataagentfake.V2(kataagentfake.Container{Devices: []kataagentfake.Device{dev}}), func(r *katagrpc.StatsContainerResponse) {
				r.CgroupStats.BlkioStats.IoServiceBytesRecursive[0].Major = 1 << 40
			}),
			v: agent430,
			want: containerSignals{MemoryLimit: unlimited, Throttling: &containerThrottling{ThrottledKnown: true}, Pids: &source.Pids{Current: 1, Limit: unlimited},
				BlockIO: blockIOResult{Layout: "v2", Why: "out of range"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := convertContainer("a", tc.reply, tc.v)
			if err != nil {
				t.Fatal(err)
			}
			got := c.Signals
			// Reasons are checked by fragment, then compared whole.
			for _, why := range []struct{ got, want *string }{
				{&got.LimitWhy, &tc.want.LimitWhy}, {&got.BlockIO.Why, &tc.want.BlockIO.Why},
			} {
				if !strings.Contains(*why.got, *why.want) || (*why.want == "") != (*why.got == "") {
					t.Errorf("reason %q; want one containing %q", *why.got, *why.want)
				}
				*why.got = *why.want
			}
			if got.Throttling != nil && tc.want.Throttling != nil {
				if w := tc.want.Throttling.ThrottledWhy; !strings.Contains(got.Throttling.ThrottledWhy, w) || (w == "") != (got.Throttling.ThrottledWhy == "") {
					t.Errorf("throttled reason %q; want one containing %q", got.Throttling.ThrottledWhy, w)
				}
				got.Throttling.ThrottledWhy = tc.want.Throttling.ThrottledWhy
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestThrottledTimeFixedVersion(t *testing.T) {
	for _, tc := range []struct {
		v     string
		fixed bool
	}{{"4.1.0", false}, {"4.2.0", false}, {"4.2.9", false}, {"4.3.0", true}, {"4.3.0-rc0", true}, {"5.0", true}, {"3.32.0", false}} {
		if got := !parseAgentVersion(tc.v, "").less(throttledTimeFixed); got != tc.fixed {
			t.Errorf("%s counted fixed = %v, want %v", tc.v, got, tc.fixed)
		}
	}
}

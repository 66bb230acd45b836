package microvm

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// The signals of scripted guests, through the real handshake, ttrpc and
// conversion.
func TestSampleSignals(t *testing.T) {
	throttledV1 := kataagentfake.Container{UsageBytes: mib, LimitBytes: 64 * mib, Periods: 1000, ThrottledPeriods: 800, ThrottledNanos: 16_000_000_000,
		Pids: 4, PidsLimit: 64, TitleCaseOps: true,
		Devices: []kataagentfake.Device{{Major: 254, ReadBytes: 1 * mib, WriteBytes: 64 * mib, ReadIOs: 16, WriteIOs: 1024}},
		Network: []*katagrpc.NetworkStats{kataagentfake.Iface("eth0", 10*mib, 7000, 20*mib, 14000), kataagentfake.Iface("lo", 4096, 8, 4096, 8)}}
	sidecarV1 := kataagentfake.Container{UsageBytes: mib, LimitBytes: 16 * mib, Periods: 10, Pids: 1, PidsLimit: 16,
		Network: throttledV1.Network} // the same guest interfaces
	v2 := kataagentfake.Container{UsageBytes: mib, Periods: 1000, ThrottledPeriods: 800, ThrottledNanos: 16_000_000_000, Pids: 2}
	v2Old := v2
	v2Old.ThrottledNanos = 0 // what an agent before the 13851 fix sends

	eth0 := source.InterfaceCounters{Name: "eth0", RxBytes: 10 * mib, RxPackets: 7000, TxBytes: 20 * mib, TxPackets: 14000}
	for _, tc := range []struct {
		name       string
		version    string
		replies    map[string]*katagrpc.StatsContainerResponse
		want       signalsOf
		absentHere []string // signal fields absent beyond the guest agent's usual ones
	}{
		{
			name:    "v1 guest, two containers: limit, throttling, pids and block IO summed, the shared network once",
			version: "3.2.0",
			replies: map[string]*katagrpc.StatsContainerResponse{"a": kataagentfake.V1(throttledV1), "b": kataagentfake.V1(sidecarV1)},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: limited(80 * mib)},
				Throttling: &source.CPUThrottling{Periods: u64p(1010), ThrottledPeriods: u64p(800), ThrottledUsec: u64p(16_000_000)},
				Pids:       &source.Pids{Current: 5, Limit: limited(80)},
				Network: &source.Network{Layer: source.NetworkLayerGuest, Total: &source.InterfaceCounters{Name: "total", RxBytes: 10 * mib, RxPackets: 7000, TxBytes: 20 * mib, TxPackets: 14000},
					Interfaces: []source.InterfaceCounters{eth0}, Loopback: &source.InterfaceCounters{Name: "lo", RxBytes: 4096, RxPackets: 8, TxBytes: 4096, TxPackets: 8}},
				BlockIO: &source.BlockIO{ReadBytes: 1 * mib, WriteBytes: 64 * mib, ReadIOs: 16, WriteIOs: 1024,
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 1 * mib, WriteBytes: 64 * mib, ReadIOs: 16, WriteIOs: 1024}}},
			},
		},
		{
			name:       "v2 guest, agent 4.1.0: throttled time absent (kata issue 13851), periods kept",
			version:    "4.1.0",
			replies:    map[string]*katagrpc.StatsContainerResponse{"a": kataagentfake.V2(v2Old)},
			want:       signalsOf{Memory: &source.MemorySignals{LimitBytes: unlimited}, Throttling: &source.CPUThrottling{Periods: u64p(1000), ThrottledPeriods: u64p(800)}, Pids: &source.Pids{Current: 2, Limit: unlimited}},
			absentHere: []string{"cpu_throttling.throttled_usec", "network", "block_io"},
		},
		{
			name:       "v2 guest, fixed agent 4.3.0: throttled time in us",
			version:    "4.3.0",
			replies:    map[string]*katagrpc.StatsContainerResponse{"a": kataagentfake.V2(v2)},
			want:       signalsOf{Memory: &source.MemorySignals{LimitBytes: unlimited}, Throttling: &source.CPUThrottling{Periods: u64p(1000), ThrottledPeriods: u64p(800), ThrottledUsec: u64p(16_000_000)}, Pids: &source.Pids{Current: 2, Limit: unlimited}},
			absentHere: []string{"network", "block_io"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []kataagentfake.Option{kataagentfake.WithVersion(tc.version)}
			var ids []string
			for _, id := range []string{"a", "b"} {
				if r, ok := tc.replies[id]; ok {
					opts, ids = append(opts, kataagentfake.WithContainer(id, r)), append(ids, id)
				}
			}
			agent := kataagentfake.New(t, t.TempDir(), opts...)
			got := sample(t, mustOpen(t, agent.Address(), testConfig(), ids...))
			if got.Network != nil {
				got.Network.Origin = ""
			}
			if got.BlockIO != nil {
				got.BlockIO.Origin = ""
			}
			if diff := cmp.Diff(tc.want, signalsOf{got.Memory, got.Throttling, got.Pids, got.Network, got.BlockIO}); diff != "" {
				t.Errorf("signals (-want +got):\n%s", diff)
			}
			usual := []string{"memory_signals.high_bytes", "memory_signals.oom_kills", "memory_signals.oom_group_kills", "memory_signals.oom_events",
				"memory_signals.max_events", "memory_signals.under_oom", "cpu_throttling.quota_usec", "cpu_throttling.period_usec", "pressure"}
			want := map[string]bool{}
			for _, f := range append(usual, tc.absentHere...) {
				want[f] = true
			}
			gotAbsent := map[string]bool{}
			for _, a := range got.Absent {
				if isSignalField(a.Field) {
					gotAbsent[a.Field] = true
				}
			}
			if diff := cmp.Diff(want, gotAbsent); diff != "" {
				t.Errorf("absent fields (-want +got):\n%s", diff)
			}
		})
	}
}

// The source asks the agent for StatsContainer and Health.Version and
// nothing else: above all never GetOOMEvent, whose events belong to the
// shim (a second reader would steal them). Counted on the wire, through
// full, partial and failed polls and a reconnect.
func TestOnlyStatsAndVersionCalled(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(),
		kataagentfake.WithContainer("a", kataagentfake.V1(kataagentfake.Container{LimitBytes: 64 * mib, Periods: 5})),
		kataagentfake.WithContainer("b", kataagentfake.V2(kataagentfake.Container{})))
	s := mustOpen(t, agent.Address(), testConfig(), "a", "b", "ghost")
	for range 3 {
		sample(t, s) // partial: ghost is unknown
	}
	agent.Restart()
	for i := 0; ; i++ { // the first poll may find the old connection gone
		if _, err := s.Sample(context.Background()); err == nil {
			break
		} else if i > 50 {
			t.Fatalf("no sample after the restart: %v", err)
		}
	}
	want := map[string]bool{"/grpc.AgentService/StatsContainer": true, "/grpc.Health/Version": true}
	calls := agent.Calls()
	for m, n := range calls {
		if !want[m] {
			t.Errorf("the source called %s %d time(s); it may call only StatsContainer and Health.Version", m, n)
		}
	}
	if calls["/grpc.AgentService/StatsContainer"] < 12 || calls["/grpc.Health/Version"] != 2 || calls["/grpc.AgentService/GetOOMEvent"] != 0 {
		t.Errorf("calls %v; want >= 12 StatsContainer, 2 Version (one per connection), no GetOOMEvent", calls)
	}
}

package microvm

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// Absent entries the guest agent always has; Reason is a fragment.
var (
	memAbsent = []source.Absent{
		{Field: "memory_signals.high_bytes", Reason: "memory.high"},
		{Field: "memory_signals.oom_kills", Reason: "failcnt counts limit hits, not kills"},
		{Field: "memory_signals.oom_group_kills", Reason: "memory.events"},
		{Field: "memory_signals.oom_events", Reason: "memory.events"},
		{Field: "memory_signals.max_events", Reason: "memory.events"},
		{Field: "memory_signals.under_oom", Reason: "memory.oom_control"},
	}
	quotaAbsent    = []source.Absent{{Field: "cpu_throttling.quota_usec", Reason: "quota"}, {Field: "cpu_throttling.period_usec", Reason: "quota"}}
	pressureAbsent = source.Absent{Field: "pressure", Reason: "pressure stall"}
	noNetwork      = source.Absent{Field: "network", Reason: "never fills them"}
	noBlkio        = source.Absent{Field: "block_io", Reason: "0 would claim no IO"}
)

func absents(parts ...any) []source.Absent {
	var out []source.Absent
	for _, p := range parts {
		switch p := p.(type) {
		case source.Absent:
			out = append(out, p)
		case []source.Absent:
			out = append(out, p...)
		}
	}
	return out
}

// signalsOf is the signals part of a Reading, what TestAggregateSignals
// compares.
type signalsOf struct {
	Memory     *source.MemorySignals
	Throttling *source.CPUThrottling
	Pids       *source.Pids
	Network    *source.Network
	BlockIO    *source.BlockIO
}

func TestAggregateSignals(t *testing.T) {
	const addr = "hvsock:///run/vc/vm/x/clh.sock:1024"
	dev := func(major, minor uint32, rb, wb, ri, wi uint64) kataagentfake.Device {
		return kataagentfake.Device{Major: uint64(major), Minor: uint64(minor), ReadBytes: rb, WriteBytes: wb, ReadIOs: ri, WriteIOs: wi}
	}
	v1a := kataagentfake.V1(kataagentfake.Container{LimitBytes: 64 << 20, Periods: 100, ThrottledPeriods: 80, ThrottledNanos: 1_600_000_000,
		Pids: 3, PidsLimit: 100, Devices: []kataagentfake.Device{dev(254, 0, 10, 20, 1, 2)}})
	v1b := kataagentfake.V1(kataagentfake.Container{LimitBytes: 32 << 20, Periods: 50, ThrottledPeriods: 5, ThrottledNanos: 100_000_000,
		Pids: 2, PidsLimit: 50, Devices: []kataagentfake.Device{dev(254, 0, 1, 2, 3, 4), dev(8, 0, 7, 7, 7, 7)}, TitleCaseOps: true})
	eth := func(name string, rx, tx uint64) *katagrpc.NetworkStats {
		return kataagentfake.Iface(name, rx, rx/100, tx, tx/100)
	}
	net1 := []*katagrpc.NetworkStats{eth("lo", 500, 500), eth("eth0", 1000, 2000), eth("eth1", 300, 400)}
	// The same guest interfaces read a moment later through the other container.
	net2 := []*katagrpc.NetworkStats{eth("eth0", 1100, 1900), eth("lo", 500, 600), eth("eth1", 300, 400)}
	unread := containerResult{ID: "ghost", Err: errUnknownContainer, Why: "unknown container"}

	for _, tc := range []struct {
		name    string
		v       agentVersion
		results []containerResult
		want    signalsOf
		absent  []source.Absent
	}{
		{
			name:    "two v1 containers: limits, throttling, pids summed; block IO summed per device",
			v:       agent410,
			results: []containerResult{ok("a", v1a, agent410), ok("b", v1b, agent410)},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: limited(96 << 20)},
				Throttling: &source.CPUThrottling{Periods: u64p(150), ThrottledPeriods: u64p(85), ThrottledUsec: u64p(1_700_000)},
				Pids:       &source.Pids{Current: 5, Limit: limited(150)},
				BlockIO: &source.BlockIO{ReadBytes: 18, WriteBytes: 29, ReadIOs: 11, WriteIOs: 13,
					Devices: []source.DeviceIO{{Major: 8, ReadBytes: 7, WriteBytes: 7, ReadIOs: 7, WriteIOs: 7}, {Major: 254, ReadBytes: 11, WriteBytes: 22, ReadIOs: 4, WriteIOs: 6}},
					Origin:  "guest agent " + addr + ": StatsContainer blkio_stats (guest cgroup v1 layout), summed over containers"},
			},
			absent: absents(memAbsent, quotaAbsent, pressureAbsent, noNetwork),
		},
		{
			name: "one unlimited container makes the sums unlimited",
			v:    agent410,
			results: []containerResult{ok("a", v1a, agent410), ok("b", kataagentfake.V1(kataagentfake.Container{
				Devices: []kataagentfake.Device{dev(254, 0, 1, 1, 1, 1)}}), agent410)},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: unlimited},
				Throttling: &source.CPUThrottling{Periods: u64p(100), ThrottledPeriods: u64p(80), ThrottledUsec: u64p(1_600_000)},
				Pids:       &source.Pids{Current: 4, Limit: unlimited},
				BlockIO: &source.BlockIO{ReadBytes: 11, WriteBytes: 21, ReadIOs: 2, WriteIOs: 3,
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 11, WriteBytes: 21, ReadIOs: 2, WriteIOs: 3}},
					Origin:  "guest agent " + addr + ": StatsContainer blkio_stats (guest cgroup v1 layout), summed over containers"},
			},
			absent: absents(memAbsent, quotaAbsent, pressureAbsent, noNetwork),
		},
		{
			name: "v2 guests on agent 4.1.0: throttled time absent (13851), periods summed; an unreadable limit makes the limit absent",
			v:    agent410,
			results: []containerResult{
				ok("a", kataagentfake.V2(kataagentfake.Container{LimitBytes: 1 << 30, Periods: 10, ThrottledPeriods: 9}), agent410),
				ok("b", with(kataagentfake.V2(kataagentfake.Container{Periods: 1}), func(r *katagrpc.StatsContainerResponse) { r.CgroupStats.MemoryStats.Usage.Limit = 0 }), agent410),
			},
			want: signalsOf{
				Throttling: &source.CPUThrottling{Periods: u64p(11), ThrottledPeriods: u64p(9)},
				Pids:       &source.Pids{Current: 2, Limit: unlimited},
			},
			absent: absents(source.Absent{Field: "memory_signals.limit_bytes", Reason: "container(s) b: the agent sent memory limit 0"}, memAbsent,
				source.Absent{Field: "cpu_throttling.throttled_usec", Reason: `container(s) a, b: agent "4.1.0"`}, quotaAbsent, pressureAbsent, noNetwork, noBlkio),
		},
		{
			name: "network: each guest interface once across containers (larger counters), loopback apart, total of the rest",
			v:    agent430,
			results: []containerResult{
				ok("a", kataagentfake.V2(kataagentfake.Container{Network: net1}), agent430),
				ok("b", kataagentfake.V2(kataagentfake.Container{Network: net2}), agent430),
			},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: unlimited},
				Throttling: &source.CPUThrottling{Periods: u64p(0), ThrottledPeriods: u64p(0), ThrottledUsec: u64p(0)},
				Pids:       &source.Pids{Current: 2, Limit: unlimited},
				Network: &source.Network{Layer: source.NetworkLayerGuest, Origin: "guest agent " + addr + ": StatsContainer network_stats, each interface once",
					Total: &source.InterfaceCounters{Name: "total", RxBytes: 1400, RxPackets: 14, TxBytes: 2400, TxPackets: 24},
					Interfaces: []source.InterfaceCounters{
						{Name: "eth0", RxBytes: 1100, RxPackets: 11, TxBytes: 2000, TxPackets: 20},
						{Name: "eth1", RxBytes: 300, RxPackets: 3, TxBytes: 400, TxPackets: 4},
					},
					Loopback: &source.InterfaceCounters{Name: "lo", RxBytes: 500, RxPackets: 5, TxBytes: 600, TxPackets: 6}},
			},
			absent: absents(memAbsent, quotaAbsent, pressureAbsent, noBlkio),
		},
		{
			name:    "network: loopback only (a guest without a network) has no total",
			v:       agent430,
			results: []containerResult{ok("a", kataagentfake.V2(kataagentfake.Container{Network: []*katagrpc.NetworkStats{eth("lo", 5, 5)}}), agent430)},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: unlimited},
				Throttling: &source.CPUThrottling{Periods: u64p(0), ThrottledPeriods: u64p(0), ThrottledUsec: u64p(0)},
				Pids:       &source.Pids{Current: 1, Limit: unlimited},
				Network: &source.Network{Layer: source.NetworkLayerGuest, Origin: "guest agent " + addr + ": StatsContainer network_stats, each interface once",
					LoopbackOnly: true, Loopback: &source.InterfaceCounters{Name: "lo", RxBytes: 5, TxBytes: 5}},
			},
			absent: absents(memAbsent, quotaAbsent, pressureAbsent, noBlkio),
		},
		{
			name: "v2 block IO of one container, another with no IO yet (io.stat empty) adds nothing",
			v:    agent430,
			results: []containerResult{
				ok("a", kataagentfake.V2(kataagentfake.Container{Devices: []kataagentfake.Device{dev(254, 0, 4096, 8192, 1, 2)}}), agent430),
				ok("pause", kataagentfake.V2(kataagentfake.Container{}), agent430),
			},
			want: signalsOf{
				Memory:     &source.MemorySignals{LimitBytes: unlimited},
				Throttling: &source.CPUThrottling{Periods: u64p(0), ThrottledPeriods: u64p(0), ThrottledUsec: u64p(0)},
				Pids:       &source.Pids{Current: 2, Limit: unlimited},
				BlockIO: &source.BlockIO{ReadBytes: 4096, WriteBytes: 8192, ReadIOs: 1, WriteIOs: 2,
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 4096, WriteBytes: 8192, ReadIOs: 1, WriteIOs: 2}},
					Origin:  "guest agent " + addr + ": StatsContainer blkio_stats (guest cgroup v2 layout), summed over containers"},
			},
			absent: absents(memAbsent, quotaAbsent, pressureAbsent, noNetwork),
		},
		{
			name: "no throttling_data or pids_stats in one container; malformed blkio in another",
			v:    agent430,
			results: []containerResult{
				ok("a", kataagentfake.V2(kataagentfake.Container{NoThrottling: true, NoPids: true}), agent430),
				ok("b", with(kataagentfake.V2(kataagentfake.Container{Devices: []kataagentfake.Device{dev(1, 0, 1, 1, 1, 1)}}), func(r *katagrpc.StatsContainerResponse) {
					r.CgroupStats.BlkioStats.IoServiceBytesRecursive[2].Minor = 1 << 33
				}), agent430),
			},
			want: signalsOf{Memory: &source.MemorySignals{LimitBytes: unlimited}},
			absent: absents(memAbsent, source.Absent{Field: "cpu_throttling", Reason: "no throttling_data in the reply of container(s) a"}, pressureAbsent,
				source.Absent{Field: "pids", Reason: "no pids_stats in the reply of container(s) a"}, noNetwork,
				source.Absent{Field: "block_io", Reason: "container(s) b: blkio_stats io_service_bytes_recursive names device 1:8589934592, out of range"}),
		},
		{
			name:    "partial: no counter (throttling, network, block IO); the gauges of the containers read",
			v:       agent410,
			results: []containerResult{ok("a", with(v1a, func(r *katagrpc.StatsContainerResponse) { r.NetworkStats = net1 }), agent410), unread},
			want: signalsOf{
				Memory: &source.MemorySignals{LimitBytes: limited(64 << 20)},
				Pids:   &source.Pids{Current: 3, Limit: limited(100)},
			},
			absent: absents(memAbsent, source.Absent{Field: "cpu_throttling", Reason: "partial sample: 1 of 2 containers unread"}, pressureAbsent,
				source.Absent{Field: "network", Reason: "partial sample"}, source.Absent{Field: "block_io", Reason: "partial sample"}),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := aggregate(addr, tc.v, tc.results)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, signalsOf{got.Memory, got.Throttling, got.Pids, got.Network, got.BlockIO}); diff != "" {
				t.Errorf("signals (-want +got):\n%s", diff)
			}
			if got.Pressure != nil {
				t.Errorf("Pressure = %+v; the guest agent has none", got.Pressure)
			}
			var sig []source.Absent
			for _, a := range got.Absent {
				if isSignalField(a.Field) {
					sig = append(sig, a)
				}
			}
			if len(sig) != len(tc.absent) {
				t.Fatalf("absent signals:\n%s\nwant:\n%s", fields(sig), fields(tc.absent))
			}
			for i, w := range tc.absent {
				if sig[i].Field != w.Field || !strings.Contains(sig[i].Reason, w.Reason) {
					t.Errorf("absent[%d] = %s: %q; want %s containing %q", i, sig[i].Field, sig[i].Reason, w.Field, w.Reason)
				}
			}
		})
	}
}

func fields(as []source.Absent) string {
	var b strings.Builder
	for _, a := range as {
		b.WriteString("  " + a.Field + ": " + a.Reason + "\n")
	}
	return b.String()
}

// Sums saturate like the memory ones.
func TestAggregateSignalsSaturate(t *testing.T) {
	const big = ^uint64(0) - 5
	huge := kataagentfake.V1(kataagentfake.Container{LimitBytes: 1 << 62, Periods: big, Pids: big, PidsLimit: big,
		Devices: []kataagentfake.Device{{Major: 1, WriteBytes: big}}})
	r, err := aggregate("vsock://3:1024", agent410, []containerResult{ok("a", huge, agent410), ok("b", huge, agent410)})
	if err != nil {
		t.Fatal(err)
	}
	const maxU = ^uint64(0)
	if r.Memory.LimitBytes.Value != 1<<63 || *r.Throttling.Periods != maxU || r.Pids.Current != maxU || r.Pids.Limit.Value != maxU ||
		r.BlockIO.WriteBytes != maxU || r.BlockIO.Devices[0].WriteBytes != maxU {
		t.Fatalf("sums %+v %+v %+v %+v; want saturated at 2^64-1", r.Memory.LimitBytes, r.Throttling, r.Pids, r.BlockIO)
	}
}

func u64p(v uint64) *uint64 { return &v }

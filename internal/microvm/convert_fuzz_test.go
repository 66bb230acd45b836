package microvm

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// FuzzConvertContainer feeds arbitrary StatsContainer replies (any bytes the
// agent could send, decoded as the wire message) through the conversion and
// the sums: it must never panic; a reply it accepts must keep the working
// set within the usage and the peak at or above it, report no unlimited
// value as a number, keep totals equal to their parts; and a partial sample
// of it must carry no counter.
func FuzzConvertContainer(f *testing.F) {
	dev := kataagentfake.Device{Major: 254, ReadBytes: 4096, WriteBytes: 8192, ReadIOs: 1, WriteIOs: 2}
	net := []*katagrpc.NetworkStats{kataagentfake.Iface("lo", 1, 1, 1, 1), kataagentfake.Iface("eth0", 10, 2, 20, 3)}
	for _, seed := range []*katagrpc.StatsContainerResponse{
		{CgroupStats: &katagrpc.CgroupStats{
			CpuStats:    &katagrpc.CpuStats{CpuUsage: &katagrpc.CpuUsage{TotalUsage: 1_000_000_000}},
			MemoryStats: &katagrpc.MemoryStats{Usage: &katagrpc.MemoryData{Usage: 100, MaxUsage: 200, Limit: 1 << 62}, Stats: map[string]uint64{"inactive_file": 300}},
		}},
		{CgroupStats: &katagrpc.CgroupStats{
			CpuStats:    &katagrpc.CpuStats{CpuUsage: &katagrpc.CpuUsage{TotalUsage: ^uint64(0), PercpuUsage: []uint64{1, 2}}},
			MemoryStats: &katagrpc.MemoryStats{Usage: &katagrpc.MemoryData{Usage: ^uint64(0), Limit: 9223372036854771712}, Stats: map[string]uint64{"total_inactive_file": 7}},
		}},
		{},
		kataagentfake.V1(kataagentfake.Container{LimitBytes: 64 << 20, Periods: 5, ThrottledPeriods: 4, ThrottledNanos: 3e9, Pids: 3, PidsLimit: 9,
			Devices: []kataagentfake.Device{dev}, TitleCaseOps: true, Network: net}),
		kataagentfake.V2(kataagentfake.Container{Periods: 5, ThrottledPeriods: 4, Devices: []kataagentfake.Device{dev, {Major: 8, DiscardBytes: 1}},
			Network: net[:1]}),
		kataagentfake.V2(kataagentfake.Container{NoThrottling: true, NoPids: true}),
	} {
		b, err := proto.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "4.1.0")
		f.Add(b, "4.3.0")
		f.Add(b, "3.2.0")
		f.Add(b, "")
	}
	f.Fuzz(func(t *testing.T, wire []byte, version string) {
		var r katagrpc.StatsContainerResponse
		if proto.Unmarshal(wire, &r) != nil {
			return
		}
		v := parseAgentVersion(version, "0.0.1")
		c, err := convertContainer("c", &r, v)
		if err != nil {
			return
		}
		if c.WorkingSetBytes > c.MemoryBytes {
			t.Fatalf("working set %d above usage %d", c.WorkingSetBytes, c.MemoryBytes)
		}
		if c.PeakOffered && c.PeakBytes < c.MemoryBytes {
			t.Fatalf("peak %d below usage %d", c.PeakBytes, c.MemoryBytes)
		}
		if l := c.Signals.MemoryLimit; l != nil && (l.Unlimited && l.Value != 0 || l.Value > unlimitedAbove) {
			t.Fatalf("memory limit %+v: unlimited said as a number", l)
		}

		full, err := aggregate("vsock://3:1024", v, []containerResult{{ID: "a", Stats: c}, {ID: "b", Stats: c}})
		if err != nil {
			t.Fatalf("aggregate of two read containers: %v", err)
		}
		checkSums(t, full)

		partial, err := aggregate("vsock://3:1024", v, []containerResult{{ID: "a", Stats: c}, {ID: "b", Err: source.ErrTimeout, Why: "timed out"}})
		if err != nil {
			t.Fatalf("aggregate of a partial sweep: %v", err)
		}
		if partial.CPUUsageUsec != nil || partial.MemoryPeakBytes != nil || partial.Throttling != nil || partial.Network != nil || partial.BlockIO != nil ||
			partial.Pressure != nil || (partial.Memory != nil && (partial.Memory.OOMKills != nil || partial.Memory.OOMGroupKills != nil ||
			partial.Memory.OOMEvents != nil || partial.Memory.MaxEvents != nil)) {
			t.Fatalf("partial sample carries a counter: %+v", partial)
		}
	})
}

// checkSums asserts what every Reading's signals keep: unlimited is never a
// number, totals are the sums of their parts, loopback stays out of the
// total.
func checkSums(t *testing.T, r source.Reading) {
	t.Helper()
	for _, l := range []*source.Limit{limitOf(r.Memory), pidsLimitOf(r.Pids)} {
		if l != nil && l.Unlimited && l.Value != 0 {
			t.Fatalf("limit %+v: unlimited with a value", l)
		}
	}
	if m := r.Memory; m != nil && (m.OOMKills != nil || m.HighBytes != nil) {
		t.Fatalf("memory signals %+v: the guest agent offers no OOM count or memory.high", m)
	}
	if n := r.Network; n != nil {
		sum := source.InterfaceCounters{Name: "total"}
		for _, i := range n.Interfaces {
			if i.Name == "lo" || i.Name == "" {
				t.Fatalf("interface %q among the non-loopback ones", i.Name)
			}
			sum.Add(i)
		}
		switch {
		case n.LoopbackOnly != (n.Total == nil), n.LoopbackOnly && len(n.Interfaces) > 0:
			t.Fatalf("network %+v: loopback_only without a total, and only then", n)
		case n.Total != nil && *n.Total != sum:
			t.Fatalf("network total %+v; the interfaces sum to %+v", *n.Total, sum)
		}
	}
	if b := r.BlockIO; b != nil {
		var s source.BlockIO
		for _, d := range b.Devices {
			s.ReadBytes, s.WriteBytes = source.AddSat(s.ReadBytes, d.ReadBytes), source.AddSat(s.WriteBytes, d.WriteBytes)
			s.ReadIOs, s.WriteIOs = source.AddSat(s.ReadIOs, d.ReadIOs), source.AddSat(s.WriteIOs, d.WriteIOs)
		}
		if s.ReadBytes != b.ReadBytes || s.WriteBytes != b.WriteBytes || s.ReadIOs != b.ReadIOs || s.WriteIOs != b.WriteIOs {
			t.Fatalf("block IO totals %+v; the devices sum to %+v", b, s)
		}
	}
}

func limitOf(m *source.MemorySignals) *source.Limit {
	if m == nil {
		return nil
	}
	return m.LimitBytes
}

func pidsLimitOf(p *source.Pids) *source.Limit {
	if p == nil {
		return nil
	}
	return p.Limit
}

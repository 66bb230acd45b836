package microvm

import (
	"testing"

	"google.golang.org/protobuf/proto"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// FuzzConvertContainer feeds arbitrary StatsContainer replies (any bytes the
// agent could send, decoded as the wire message) through the conversion: it
// must never panic, and a reply it accepts must keep the working set within
// the usage and the peak at or above it.
func FuzzConvertContainer(f *testing.F) {
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
	} {
		b, err := proto.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "4.1.0")
		f.Add(b, "3.2.0")
		f.Add(b, "")
	}
	f.Fuzz(func(t *testing.T, wire []byte, version string) {
		var r katagrpc.StatsContainerResponse
		if proto.Unmarshal(wire, &r) != nil {
			return
		}
		c, err := convertContainer("c", &r, parseAgentVersion(version, "0.0.1"))
		if err != nil {
			return
		}
		if c.WorkingSetBytes > c.MemoryBytes {
			t.Fatalf("working set %d above usage %d", c.WorkingSetBytes, c.MemoryBytes)
		}
		if c.PeakOffered && c.PeakBytes < c.MemoryBytes {
			t.Fatalf("peak %d below usage %d", c.PeakBytes, c.MemoryBytes)
		}
	})
}

package kataagentfake

import (
	"fmt"
	"math"
	"strings"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// V1Unlimited is the memory limit a cgroup v1 guest reports for "no limit"
// (2^63 rounded down to 4 KiB pages).
const V1Unlimited uint64 = 9223372036854771712

// Container is the guest cgroup state a scripted reply describes. Units are
// the agent's: bytes and, for CPU, what the agent would put on the wire
// (nanoseconds, or microseconds for an agent older than 3.9.0 on a v2 guest).
type Container struct {
	UsageBytes        uint64
	MaxUsageBytes     uint64 // 0: the guest kernel has no memory.peak
	LimitBytes        uint64 // 0: unlimited (u64::MAX on v2, V1Unlimited on v1)
	InactiveFileBytes uint64 // memory.stat inactive_file
	// TotalInactiveFileBytes is v1's hierarchical total_inactive_file.
	TotalInactiveFileBytes       uint64
	CPUTotal, CPUUser, CPUSystem uint64
	// OmitInactiveFile leaves the inactive_file keys out of the map.
	OmitInactiveFile bool

	// cpu.stat nr_periods and nr_throttled, and the throttled time in ns
	// as the agent sends it. An agent without the kata issue 13851 fix sends
	// 0 for a v2 guest whatever the guest was throttled: script that by
	// leaving ThrottledNanos 0.
	Periods, ThrottledPeriods, ThrottledNanos uint64
	// NoThrottling leaves throttling_data out (no cpu controller).
	NoThrottling bool
	// Pids is pids.current (0 is sent as 1, the container's init);
	// PidsLimit is pids.max, 0 for "max" as the agent encodes it.
	Pids, PidsLimit uint64
	// NoPids leaves pids_stats out (no pids controller).
	NoPids bool
	// Network is network_stats as sent. The Rust agent always sends none.
	Network []*katagrpc.NetworkStats
	// Devices is the block IO charged to the cgroup, one entry per device;
	// none means blkio_stats with no entries.
	Devices []Device
	// TitleCaseOps spells v1 blkio ops "Read", "Write", ... as the kernel
	// files, runc and the old Go agent do; the Rust agent sends lower case.
	TitleCaseOps bool
}

// Device is one block device's IO counters in a scripted reply.
type Device struct {
	Major, Minor                             uint64
	ReadBytes, WriteBytes, ReadIOs, WriteIOs uint64
	DiscardBytes, DiscardIOs                 uint64 // v2 io.stat dbytes, dios
}

// Iface is one network_stats entry with the given byte and packet counts.
func Iface(name string, rxBytes, rxPackets, txBytes, txPackets uint64) *katagrpc.NetworkStats {
	return &katagrpc.NetworkStats{Name: name, RxBytes: rxBytes, RxPackets: rxPackets, TxBytes: txBytes, TxPackets: txPackets}
}

// signals fills what V1 and V2 send alike: throttling_data, pids_stats and
// network_stats.
func (c Container) signals(r *katagrpc.StatsContainerResponse) *katagrpc.StatsContainerResponse {
	cg := r.CgroupStats
	if !c.NoThrottling {
		cg.CpuStats.ThrottlingData = &katagrpc.ThrottlingData{
			Periods: c.Periods, ThrottledPeriods: c.ThrottledPeriods, ThrottledTime: c.ThrottledNanos,
		}
	}
	if !c.NoPids {
		cg.PidsStats = &katagrpc.PidsStats{Current: max(c.Pids, 1), Limit: c.PidsLimit}
	}
	r.NetworkStats = c.Network
	return r
}

// blkioV2 is what the agent makes of v2 io.stat: only
// io_service_bytes_recursive, six ops per device.
func (c Container) blkioV2() *katagrpc.BlkioStats {
	b := &katagrpc.BlkioStats{}
	for _, d := range c.Devices {
		for _, op := range []struct {
			name string
			v    uint64
		}{{"read", d.ReadBytes}, {"write", d.WriteBytes}, {"rios", d.ReadIOs}, {"wios", d.WriteIOs}, {"dbytes", d.DiscardBytes}, {"dios", d.DiscardIOs}} {
			b.IoServiceBytesRecursive = append(b.IoServiceBytesRecursive, &katagrpc.BlkioStatsEntry{Major: d.Major, Minor: d.Minor, Op: op.name, Value: op.v})
		}
	}
	return b
}

// blkioV1 is what the agent makes of v1 blkio.throttle.io_service_bytes
// and io_serviced: read, write, sync, async, total per device.
func (c Container) blkioV1() *katagrpc.BlkioStats {
	name := func(op string) string {
		if c.TitleCaseOps {
			return strings.ToUpper(op[:1]) + op[1:]
		}
		return op
	}
	entries := func(d Device, read, write uint64) []*katagrpc.BlkioStatsEntry {
		var out []*katagrpc.BlkioStatsEntry
		// Sync/async split is arbitrary here: reads async, writes sync.
		for _, op := range []struct {
			name string
			v    uint64
		}{{"read", read}, {"write", write}, {"sync", write}, {"async", read}, {"total", read + write}} {
			out = append(out, &katagrpc.BlkioStatsEntry{Major: d.Major, Minor: d.Minor, Op: name(op.name), Value: op.v})
		}
		return out
	}
	b := &katagrpc.BlkioStats{}
	for _, d := range c.Devices {
		b.IoServiceBytesRecursive = append(b.IoServiceBytesRecursive, entries(d, d.ReadBytes, d.WriteBytes)...)
		b.IoServicedRecursive = append(b.IoServicedRecursive, entries(d, d.ReadIOs, d.WriteIOs)...)
	}
	return b
}

// V2 is the reply of a cgroup v2 guest: memory.current, memory.peak,
// memory.max ("max" = u64::MAX), raw v2 memory.stat (anon, file,
// inactive_file, ...), no per-cpu usage, use_hierarchy false, cache 0;
// blkio from io.stat in io_service_bytes_recursive only.
func V2(c Container) *katagrpc.StatsContainerResponse {
	limit := c.LimitBytes
	if limit == 0 {
		limit = math.MaxUint64
	}
	stats := map[string]uint64{
		"anon":                    c.UsageBytes / 2,
		"file":                    c.InactiveFileBytes + 4096,
		"active_file":             4096,
		"slab":                    8192,
		"pgfault":                 12345,
		"workingset_refault_file": 0,
	}
	if !c.OmitInactiveFile {
		stats["inactive_file"] = c.InactiveFileBytes
	}
	return c.signals(&katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{
		CpuStats: &katagrpc.CpuStats{
			CpuUsage: &katagrpc.CpuUsage{
				TotalUsage:        c.CPUTotal,
				UsageInUsermode:   c.CPUUser,
				UsageInKernelmode: c.CPUSystem,
			},
		},
		MemoryStats: &katagrpc.MemoryStats{
			Usage:       &katagrpc.MemoryData{Usage: c.UsageBytes, MaxUsage: c.MaxUsageBytes, Limit: limit},
			SwapUsage:   &katagrpc.MemoryData{Limit: 0},
			KernelUsage: &katagrpc.MemoryData{Limit: math.MaxUint64},
			Stats:       stats,
		},
		BlkioStats: c.blkioV2(),
	}})
}

// V1 is the reply of a cgroup v1 guest: memory.usage_in_bytes,
// max_usage_in_bytes, limit_in_bytes (unlimited about 2^63), raw v1
// memory.stat with total_* keys, per-cpu usage, use_hierarchy true; blkio
// in io_service_bytes_recursive and io_serviced_recursive.
func V1(c Container) *katagrpc.StatsContainerResponse {
	limit := c.LimitBytes
	if limit == 0 {
		limit = V1Unlimited
	}
	stats := map[string]uint64{
		"cache":       c.InactiveFileBytes + 4096,
		"rss":         c.UsageBytes / 2,
		"total_cache": c.TotalInactiveFileBytes + 4096,
		"total_rss":   c.UsageBytes / 2,
	}
	if !c.OmitInactiveFile {
		stats["inactive_file"] = c.InactiveFileBytes
		stats["total_inactive_file"] = c.TotalInactiveFileBytes
	}
	return c.signals(&katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{
		CpuStats: &katagrpc.CpuStats{
			CpuUsage: &katagrpc.CpuUsage{
				TotalUsage:        c.CPUTotal,
				PercpuUsage:       []uint64{c.CPUTotal / 2, c.CPUTotal - c.CPUTotal/2},
				UsageInUsermode:   c.CPUUser,
				UsageInKernelmode: c.CPUSystem,
			},
		},
		MemoryStats: &katagrpc.MemoryStats{
			Cache:        c.InactiveFileBytes + 4096,
			Usage:        &katagrpc.MemoryData{Usage: c.UsageBytes, MaxUsage: c.MaxUsageBytes, Limit: limit},
			SwapUsage:    &katagrpc.MemoryData{Usage: c.UsageBytes, Limit: V1Unlimited},
			KernelUsage:  &katagrpc.MemoryData{Limit: V1Unlimited},
			UseHierarchy: true,
			Stats:        stats,
		},
		BlkioStats: c.blkioV1(),
	}})
}

// Bulky is a cgroup v1 guest's reply swollen to the given counts: keys
// memory.stat keys (key_00000, ...), devices block devices each filling all
// eight blkio lists with five ops (as under CFQ), interfaces network
// interfaces, and two huge page sizes. A hostile guest sends such replies
// with counts no agent would; with the counts statsd still reads whole (64
// devices, 64 interfaces) it is the largest real reply.
func Bulky(keys, devices, interfaces int) *katagrpc.StatsContainerResponse {
	var ifaces []*katagrpc.NetworkStats
	for i := range interfaces {
		ifaces = append(ifaces, Iface(fmt.Sprintf("eth%d", i), 1, 1, 1, 1))
	}
	r := V1(Container{UsageBytes: 1 << 20, CPUTotal: 1e9, Network: ifaces})
	for i := range keys {
		r.CgroupStats.MemoryStats.Stats[fmt.Sprintf("key_%05d", i)] = uint64(i)
	}
	r.CgroupStats.HugetlbStats = map[string]*katagrpc.HugetlbStats{"2MB": {Usage: 1}, "1GB": {Usage: 1}}
	b := &katagrpc.BlkioStats{}
	lists := []*[]*katagrpc.BlkioStatsEntry{&b.IoServiceBytesRecursive, &b.IoServicedRecursive, &b.IoQueuedRecursive,
		&b.IoServiceTimeRecursive, &b.IoWaitTimeRecursive, &b.IoMergedRecursive, &b.IoTimeRecursive, &b.SectorsRecursive}
	for d := range devices {
		for _, l := range lists {
			for _, op := range []string{"Read", "Write", "Sync", "Async", "Total"} {
				*l = append(*l, &katagrpc.BlkioStatsEntry{Major: 8, Minor: uint64(d), Op: op, Value: 1})
			}
		}
	}
	r.CgroupStats.BlkioStats = b
	return r
}

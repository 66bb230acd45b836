package kataagentfake

import (
	"math"

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
}

// V2 is the reply of a cgroup v2 guest: memory.current, memory.peak,
// memory.max ("max" = u64::MAX), raw v2 memory.stat (anon, file,
// inactive_file, ...), no per-cpu usage, use_hierarchy false, cache 0.
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
	return &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{
		CpuStats: &katagrpc.CpuStats{
			CpuUsage: &katagrpc.CpuUsage{
				TotalUsage:        c.CPUTotal,
				UsageInUsermode:   c.CPUUser,
				UsageInKernelmode: c.CPUSystem,
			},
			ThrottlingData: &katagrpc.ThrottlingData{},
		},
		MemoryStats: &katagrpc.MemoryStats{
			Usage:       &katagrpc.MemoryData{Usage: c.UsageBytes, MaxUsage: c.MaxUsageBytes, Limit: limit},
			SwapUsage:   &katagrpc.MemoryData{Limit: 0},
			KernelUsage: &katagrpc.MemoryData{Limit: math.MaxUint64},
			Stats:       stats,
		},
		PidsStats: &katagrpc.PidsStats{Current: 1},
	}}
}

// V1 is the reply of a cgroup v1 guest: memory.usage_in_bytes,
// max_usage_in_bytes, limit_in_bytes (unlimited about 2^63), raw v1
// memory.stat with total_* keys, per-cpu usage, use_hierarchy true.
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
	return &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{
		CpuStats: &katagrpc.CpuStats{
			CpuUsage: &katagrpc.CpuUsage{
				TotalUsage:        c.CPUTotal,
				PercpuUsage:       []uint64{c.CPUTotal / 2, c.CPUTotal - c.CPUTotal/2},
				UsageInUsermode:   c.CPUUser,
				UsageInKernelmode: c.CPUSystem,
			},
			ThrottlingData: &katagrpc.ThrottlingData{},
		},
		MemoryStats: &katagrpc.MemoryStats{
			Cache:        c.InactiveFileBytes + 4096,
			Usage:        &katagrpc.MemoryData{Usage: c.UsageBytes, MaxUsage: c.MaxUsageBytes, Limit: limit},
			SwapUsage:    &katagrpc.MemoryData{Usage: c.UsageBytes, Limit: V1Unlimited},
			KernelUsage:  &katagrpc.MemoryData{Limit: V1Unlimited},
			UseHierarchy: true,
			Stats:        stats,
		},
		PidsStats: &katagrpc.PidsStats{Current: 1},
	}}
}

package nodeagent

import (
	"time"

	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// sample is a measured cgroup sample of actor in one fixed epoch.
func sample(actor string, cpuUsec, memCur uint64) *sandboxstatsv1.WorkloadStatsSample {
	return &sandboxstatsv1.WorkloadStatsSample{
		ActorUid:              actor,
		ActorName:             actor + "-name",
		ActorNamespace:        "team-a",
		TemplateNamespace:     "templates",
		TemplateName:          "python",
		SandboxClass:          sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source:                sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		MemoryCurrentBytes:    memCur,
		MemoryWorkingSetBytes: memCur / 2,
		MemoryPeakBytes:       proto.Uint64(memCur * 2),
		CpuUsageUsec:          proto.Uint64(cpuUsec),
		EpochUnixNano:         time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC).UnixNano(),
	}
}

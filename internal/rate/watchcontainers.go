package rate

import (
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ContainerRow is one container of a Row's sample (`statsctl watch`'s
// per-container table): its CPU rate over the row's interval when the
// previous sample had it too, its gauges as read.
type ContainerRow struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// CPUCores is the container's CPU cores over the row's interval (delta
	// cpu_usage_usec of the same container id / delta observed_at); absent
	// when the row has no rate, the container's CPU is absent from either
	// sample, or Event says why.
	CPUCores *float64 `json:"cpu_cores,omitempty"`
	// CPUUsageUsec is the container's raw counter (microseconds).
	CPUUsageUsec *uint64 `json:"cpu_usage_usec,omitempty"`
	// Gauges as read; absent when the source has no figure of the
	// container's own (and for an exited container).
	MemoryCurrentBytes    *uint64 `json:"memory_current_bytes,omitempty"`
	MemoryWorkingSetBytes *uint64 `json:"memory_working_set_bytes,omitempty"`
	PidsCurrent           *uint64 `json:"pids_current,omitempty"`
	// Exited: the container left the workload; its counter is its last
	// (its rate 0), its gauges absent (ContainerStats.exited).
	Exited bool `json:"exited,omitempty"`
	// Event says why a container of a row with a rate has none:
	// EventFirst (not in the previous sample: it appeared since) or
	// EventCounterReset (its counter decreased).
	Event Event `json:"event,omitempty"`
}

// containerRows returns the containers of cur, each with its CPU rate
// against the same container in prev over dtNanos (withRate: the row
// has a rate, so prev and cur are comparable).
func containerRows(prev, cur *sandboxstatsv1.WorkloadStatsSample, dtNanos int64, withRate bool) []ContainerRow {
	cs := cur.GetContainers()
	if len(cs) == 0 {
		return nil
	}
	before := map[string]*sandboxstatsv1.ContainerStats{}
	if withRate {
		for _, c := range prev.GetContainers() {
			before[c.GetId()] = c
		}
	}
	out := make([]ContainerRow, 0, len(cs))
	for _, c := range cs {
		r := ContainerRow{ID: c.GetId(), Name: c.GetName(), CPUUsageUsec: c.CpuUsageUsec, Exited: c.GetExited(),
			MemoryCurrentBytes: c.MemoryCurrentBytes, MemoryWorkingSetBytes: c.MemoryWorkingSetBytes, PidsCurrent: c.PidsCurrent}
		if !c.GetMemoryIsOwn() {
			r.MemoryCurrentBytes, r.MemoryWorkingSetBytes = nil, nil
		}
		if withRate && c.CpuUsageUsec != nil {
			p, ok := before[c.GetId()]
			switch {
			case !ok:
				r.Event = EventFirst
			case p.CpuUsageUsec == nil:
			case c.GetCpuUsageUsec() < p.GetCpuUsageUsec():
				r.Event = EventCounterReset
			default:
				r.CPUCores = ptr(float64(c.GetCpuUsageUsec()-p.GetCpuUsageUsec()) * 1e3 / float64(dtNanos))
			}
		}
		out = append(out, r)
	}
	return out
}

// ownCores returns the sandbox's own share (sandbox_own_cpu_usec) in
// cores between prev and cur, dtNanos apart (a pair that gives a CPU
// rate); nil when either lacks it or it decreased.
func ownCores(prev, cur *sandboxstatsv1.WorkloadStatsSample, dtNanos int64) *float64 {
	if prev.SandboxOwnCpuUsec == nil || cur.SandboxOwnCpuUsec == nil || cur.GetSandboxOwnCpuUsec() < prev.GetSandboxOwnCpuUsec() {
		return nil
	}
	return ptr(float64(cur.GetSandboxOwnCpuUsec()-prev.GetSandboxOwnCpuUsec()) * 1e3 / float64(dtNanos))
}

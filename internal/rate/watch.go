package rate

import (
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Row is one line of `statsctl watch`: one sample, with the CPU rate (and
// the signal and traffic rates) since the previous measured sample of the
// same series when there is one.
type Row struct {
	// ObservedAt is the sample's observed_at (daemon wall clock), UTC.
	ObservedAt    time.Time `json:"observed_at"`
	ActorUID      string    `json:"actor_uid"`
	SandboxClass  string    `json:"sandbox_class"`
	Source        string    `json:"source"`
	EpochUnixNano int64     `json:"epoch_unix_nano"`
	// IntervalSeconds is the wall time the rate covers (delta observed_at);
	// absent when there is no rate.
	IntervalSeconds *float64 `json:"interval_seconds,omitempty"`
	// CPUCores is CPU cores used over the interval (delta cpu_usage_usec /
	// delta observed_at); absent when Event says why there is no rate.
	CPUCores *float64 `json:"cpu_cores,omitempty"`
	// CPUUsageUsec is the raw counter (microseconds, within the epoch).
	CPUUsageUsec *uint64 `json:"cpu_usage_usec,omitempty"`
	// Gauges in bytes as read; absent when not measured (and peak when the
	// source does not offer it).
	MemoryCurrentBytes    *uint64 `json:"memory_current_bytes,omitempty"`
	MemoryWorkingSetBytes *uint64 `json:"memory_working_set_bytes,omitempty"`
	MemoryPeakBytes       *uint64 `json:"memory_peak_bytes,omitempty"`
	// Per interval, only with a rate (and each only when its counter is in
	// both samples and did not decrease): the fraction of the wall time
	// the CFS quota throttled (delta throttled_usec / delta observed_at in
	// µs), pressure stall per second, network and block IO rates.
	ThrottledFraction *float64       `json:"throttled_fraction,omitempty"`
	Pressure          *PressureRates `json:"pressure,omitempty"`
	Network           *NetworkRates  `json:"network,omitempty"`
	BlockIO           *BlockIORates  `json:"block_io,omitempty"`
	// SandboxOwnCPUCores is the sandbox's own share (sandbox_own_cpu_usec:
	// gVisor's sentry and gofers, the pause container's part) in cores over
	// the interval, only with a rate and when both samples carry it and it
	// did not decrease; SandboxOwnCPUUsec the raw counter.
	SandboxOwnCPUCores *float64 `json:"sandbox_own_cpu_cores,omitempty"`
	SandboxOwnCPUUsec  *uint64  `json:"sandbox_own_cpu_usec,omitempty"`
	// Containers are the sample's containers, each with its CPU rate
	// where the previous sample had it too (ContainerRow).
	Containers []ContainerRow `json:"containers,omitempty"`
	// Event is empty when the row continues the previous one; otherwise it
	// says why there is no rate (epoch-reset, counter-reset, no-interval...).
	Event Event `json:"event,omitempty"`
}

// Watcher turns successive samples of one workload (as `statsctl watch`
// reads them) into Rows. The zero value is ready to use; it is not safe for
// concurrent use.
type Watcher struct {
	prev *sandboxstatsv1.WorkloadStatsSample // last measured sample
}

// Observe returns the Row for s and makes s the baseline of the next one if
// it was measured. A sample that was not measured leaves the baseline alone,
// so the next measured sample is rated over the longer interval.
func (w *Watcher) Observe(s *sandboxstatsv1.WorkloadStatsSample) Row {
	r := Row{
		ObservedAt:    time.Unix(0, s.GetObservedAtUnixNano()).UTC(),
		ActorUID:      s.GetActorUid(),
		SandboxClass:  api.ClassName(s.GetSandboxClass()),
		Source:        api.SourceName(s.GetSource()),
		EpochUnixNano: s.GetEpochUnixNano(),
	}
	cores, ev, ok := cpuCores(w.prev, s)
	r.Event = ev
	var dt int64
	if ok {
		dt = s.GetObservedAtUnixNano() - w.prev.GetObservedAtUnixNano()
		iv := float64(dt) / 1e9
		r.IntervalSeconds = &iv
		r.CPUCores = &cores
		signalRates(&r, w.prev, s, dt)
		r.SandboxOwnCPUCores = ownCores(w.prev, s, dt)
	}
	if ev == EventNotMeasured {
		return r
	}
	r.Containers = containerRows(w.prev, s, dt, ok)
	r.SandboxOwnCPUUsec = s.SandboxOwnCpuUsec
	r.CPUUsageUsec = s.CpuUsageUsec
	r.MemoryCurrentBytes = ptr(s.GetMemoryCurrentBytes())
	r.MemoryWorkingSetBytes = ptr(s.GetMemoryWorkingSetBytes())
	if s.MemoryPeakBytes != nil {
		r.MemoryPeakBytes = ptr(s.GetMemoryPeakBytes())
	}
	if ev != EventCPUAbsent {
		w.prev = s
	}
	return r
}

func ptr[T any](v T) *T { return &v }

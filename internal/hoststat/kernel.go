package hoststat

// This file is the runner kernel view: <proc>/stat through procfs, in usec.

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/procfs"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

const legendRunnerKernel = "runner kernel /proc/stat, usec of CPU time since host boot, counters: " +
	"user already includes guest and nice already includes guest_nice (do not add them); " +
	"steal is filled only under a paravirt steal clock: rising steal proves preemption, zero proves nothing"

// runnerKernel reads <proc>/stat through procfs under the read bound.
func (s *sampler) runnerKernel(ctx context.Context) *source.RunnerKernelView {
	v := &source.RunnerKernelView{Legend: legendRunnerKernel}
	st, err := bounded.Do(ctx, s.g, "hoststat:procstat:"+s.cfg.ProcRoot, s.fs.Stat)
	if err != nil {
		v.Error = fmt.Sprintf("%s/stat: %v", s.cfg.ProcRoot, err)
		return v
	}
	v.Total, v.PerCPU = runnerKernelFromStat(st)
	return v
}

// runnerKernelFromStat converts procfs's seconds (ticks / USER_HZ) into usec
// per CPU line, per-CPU lines ordered by CPU number.
func runnerKernelFromStat(st procfs.Stat) (*source.CPUTimes, []source.CPUTimes) {
	total := cpuTimes("cpu", st.CPUTotal)
	ids := make([]int64, 0, len(st.CPU))
	for id := range st.CPU {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	per := make([]source.CPUTimes, 0, len(ids))
	for _, id := range ids {
		per = append(per, *cpuTimes(fmt.Sprintf("cpu%d", id), st.CPU[id]))
	}
	return total, per
}

func cpuTimes(name string, c procfs.CPUStat) *source.CPUTimes {
	return &source.CPUTimes{
		CPU:           name,
		UserUsec:      secToUsec(c.User),
		NiceUsec:      secToUsec(c.Nice),
		SystemUsec:    secToUsec(c.System),
		IdleUsec:      secToUsec(c.Idle),
		IowaitUsec:    secToUsec(c.Iowait),
		IRQUsec:       secToUsec(c.IRQ),
		SoftIRQUsec:   secToUsec(c.SoftIRQ),
		StealUsec:     secToUsec(c.Steal),
		GuestUsec:     secToUsec(c.Guest),
		GuestNiceUsec: secToUsec(c.GuestNice),
	}
}

// secToUsec converts procfs's float seconds (an exact multiple of 1/USER_HZ)
// back to whole usec. Negative or non-finite input (never produced by the
// kernel) gives 0.
func secToUsec(sec float64) uint64 {
	if !(sec > 0) || math.IsInf(sec, 0) || sec > math.MaxUint64/1e6 {
		return 0
	}
	return uint64(math.Round(sec * 1e6))
}

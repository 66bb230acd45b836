package hoststat

// This file is the runner kernel view: <proc>/stat's cpu lines, in usec.

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

const legendRunnerKernel = "runner kernel /proc/stat, usec of CPU time since host boot, counters: " +
	"user already includes guest and nice already includes guest_nice (do not add them); " +
	"steal is filled only under a paravirt steal clock: rising steal proves preemption, zero proves nothing"

// runnerKernel reads <proc>/stat's cpu lines under the read bound.
func (s *sampler) runnerKernel(ctx context.Context) *source.RunnerKernelView {
	v := &source.RunnerKernelView{Legend: legendRunnerKernel}
	type cpuStat struct {
		total  process.CPUStat
		perCPU map[int64]process.CPUStat
	}
	st, err := bounded.Do(ctx, s.g, "hoststat:procstat:"+s.cfg.ProcRoot, func() (cpuStat, error) {
		b, err := bounded.ReadFile(filepath.Join(s.cfg.ProcRoot, "stat"), bounded.MaxFileBytes)
		if err != nil {
			return cpuStat{}, err
		}
		total, perCPU, err := process.ParseCPUStat(b)
		return cpuStat{total, perCPU}, err
	})
	if err != nil {
		v.Error = fmt.Sprintf("%s/stat: %v", s.cfg.ProcRoot, err)
		return v
	}
	v.Total, v.PerCPU = runnerKernelFromStat(st.total, st.perCPU)
	return v
}

// runnerKernelFromStat converts USER_HZ ticks into usec per CPU line,
// per-CPU lines ordered by CPU number.
func runnerKernelFromStat(total process.CPUStat, perCPU map[int64]process.CPUStat) (*source.CPUTimes, []source.CPUTimes) {
	ids := make([]int64, 0, len(perCPU))
	for id := range perCPU {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	per := make([]source.CPUTimes, 0, len(ids))
	for _, id := range ids {
		per = append(per, *cpuTimes(fmt.Sprintf("cpu%d", id), perCPU[id]))
	}
	return cpuTimes("cpu", total), per
}

func cpuTimes(name string, c process.CPUStat) *source.CPUTimes {
	return &source.CPUTimes{
		CPU:           name,
		UserUsec:      ticksToUsec(c.User),
		NiceUsec:      ticksToUsec(c.Nice),
		SystemUsec:    ticksToUsec(c.System),
		IdleUsec:      ticksToUsec(c.Idle),
		IowaitUsec:    ticksToUsec(c.Iowait),
		IRQUsec:       ticksToUsec(c.IRQ),
		SoftIRQUsec:   ticksToUsec(c.SoftIRQ),
		StealUsec:     ticksToUsec(c.Steal),
		GuestUsec:     ticksToUsec(c.Guest),
		GuestNiceUsec: ticksToUsec(c.GuestNice),
	}
}

// ticksToUsec converts USER_HZ ticks to usec; a count whose usec would
// not fit (never written by a kernel) gives 0.
func ticksToUsec(ticks uint64) uint64 {
	if ticks > math.MaxUint64/usecPerTick {
		return 0
	}
	return ticks * usecPerTick
}

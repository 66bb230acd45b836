// This file reads the signal and block IO files of a unified (v2) sandbox
// cgroup: memory.max, memory.high, memory.events, cpu.stat's bandwidth
// keys, cpu.max, the pressure files, pids.* and io.stat.

package gvisor

import (
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// v2Signals are the signal files of one v2 cgroup, read together with the
// memory and CPU files of readV2.
type v2Signals struct {
	memMax, memHigh, memEvents, cpuMax *fileReq
	cpuPSI, memPSI, ioPSI              *fileReq
	pidsCur, pidsMax, ioStat           *fileReq
}

func newV2Signals(req func(string) *fileReq) v2Signals {
	return v2Signals{
		memMax: req("memory.max"), memHigh: req("memory.high"), memEvents: req("memory.events"), cpuMax: req("cpu.max"),
		cpuPSI: req("cpu.pressure"), memPSI: req("memory.pressure"), ioPSI: req("io.pressure"),
		pidsCur: req("pids.current"), pidsMax: req("pids.max"), ioStat: req("io.stat"),
	}
}

func (v v2Signals) reqs() []*fileReq {
	return optional(v.memMax, v.memHigh, v.memEvents, v.cpuMax, v.cpuPSI, v.memPSI, v.ioPSI, v.pidsCur, v.pidsMax, v.ioStat)
}

// fill fills the signal parts of r; cpuStat is readV2's cpu.stat.
func (v v2Signals) fill(r *source.Reading, cpuStat *fileReq) error {
	if err := fillMemoryV2(r, v.memMax, v.memHigh, v.memEvents); err != nil {
		return err
	}
	if err := fillThrottlingV2(r, cpuStat, v.cpuMax); err != nil {
		return err
	}
	if err := fillPressure(r, v.cpuPSI, v.memPSI, v.ioPSI, ""); err != nil {
		return err
	}
	if err := fillPids(r, v.pidsCur, v.pidsMax, ""); err != nil {
		return err
	}
	return fillIOStat(r, v.ioStat)
}

func fillMemoryV2(r *source.Reading, maxF, highF, eventsF *fileReq) error {
	p := part{name: "memory_signals"}
	m := &source.MemorySignals{}
	for _, l := range []struct {
		f     *fileReq
		dst   **source.Limit
		field string
	}{{maxF, &m.LimitBytes, "limit_bytes"}, {highF, &m.HighBytes, "high_bytes"}} {
		v, ok, why, err := optParse(l.f, "", parseLimit)
		if err != nil {
			return err
		}
		set(&p, l.dst, v, ok, l.field, why)
	}
	ev, ok, why, err := optParse(eventsF, "", parseKeyedMap)
	if err != nil {
		return err
	}
	has := func(key string) string { return eventsF.path() + " has no " + key }
	keyed(&p, &m.OOMKills, ev, ok, "oom_kill", "oom_kills", why, has)
	keyed(&p, &m.OOMGroupKills, ev, ok, "oom_group_kill", "oom_group_kills", why, func(key string) string { return has(key) + " (Linux < 5.19)" })
	keyed(&p, &m.OOMEvents, ev, ok, "oom", "oom_events", why, has)
	keyed(&p, &m.MaxEvents, ev, ok, "max", "max_events", why, has)
	p.absent("under_oom", "cgroup v2 has no under_oom (a v1 memory.oom_control field)")
	if p.done(r) {
		r.Memory = m
	}
	return nil
}

func fillThrottlingV2(r *source.Reading, statF, maxF *fileReq) error {
	p := part{name: "cpu_throttling"}
	t := &source.CPUThrottling{}
	st, ok, why, err := optParse(statF, "", parseKeyedMap)
	if err != nil {
		return err
	}
	has := func(key string) string {
		return statF.path() + " has no " + key + " (the cpu controller is not enabled for this cgroup)"
	}
	keyed(&p, &t.Periods, st, ok, "nr_periods", "periods", why, has)
	keyed(&p, &t.ThrottledPeriods, st, ok, "nr_throttled", "throttled_periods", why, has)
	keyed(&p, &t.ThrottledUsec, st, ok, "throttled_usec", "throttled_usec", why, has)
	type cpuMax struct {
		quota  source.Limit
		period uint64
	}
	cm, ok, why, err := optParse(maxF, "", func(b []byte) (cpuMax, error) {
		q, per, err := parseCPUMax(b)
		return cpuMax{q, per}, err
	})
	if err != nil {
		return err
	}
	if !ok && maxF.err != nil {
		why += " (the cpu controller is not enabled for this cgroup)"
	}
	set(&p, &t.QuotaUsec, cm.quota, ok, "quota_usec", why)
	set(&p, &t.PeriodUsec, cm.period, ok, "period_usec", why)
	if p.done(r) {
		r.Throttling = t
	}
	return nil
}

func fillIOStat(r *source.Reading, f *fileReq) error {
	devs, ok, why, err := optParse(f, "", parseIOStat)
	if err != nil {
		return err
	}
	if !ok {
		if f.err != nil {
			why += " (the io controller is not enabled for this cgroup)"
		}
		absent(r, "block_io", why)
		return nil
	}
	b := &source.BlockIO{Devices: devs, Origin: f.path()}
	for _, d := range devs {
		b.ReadBytes, b.WriteBytes = source.AddSat(b.ReadBytes, d.ReadBytes), source.AddSat(b.WriteBytes, d.WriteBytes)
		b.ReadIOs, b.WriteIOs = source.AddSat(b.ReadIOs, d.ReadIOs), source.AddSat(b.WriteIOs, d.WriteIOs)
	}
	r.BlockIO = b
	return nil
}

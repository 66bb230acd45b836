// This file reads the signal files of a v1 (legacy or hybrid) sandbox: the
// memory hierarchy's memory.limit_in_bytes and memory.oom_control, the cpu
// hierarchy's cpu.stat and CFS quota, the pids hierarchy and, on a hybrid
// host, the pressure files of the sandbox's unified cgroup.

package gvisor

import (
	"fmt"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// nsPerUsec converts v1 cpu.stat throttled_time (ns) to microseconds.
const nsPerUsec = 1000

// v1Signals are the signal files of a v1 sandbox. A request is nil when its
// hierarchy or the sandbox's path in it is missing; the matching why says
// why.
type v1Signals struct {
	memLimit, oomControl         *fileReq
	cfsStat, cfsQuota, cfsPeriod *fileReq
	pidsCur, pidsMax             *fileReq
	cpuPSI, memPSI, ioPSI        *fileReq
	cfsWhy, pidsWhy, psiWhy      string
	blkBytes, blkIOs, blkRoot    *fileReq
	blkWhy                       string
}

func (s *cgroupSource) newV1Signals(loc *location, memReq func(string) *fileReq) v1Signals {
	v := v1Signals{memLimit: memReq("memory.limit_in_bytes"), oomControl: memReq("memory.oom_control")}
	a := s.aux
	v.cfsStat, v.cfsWhy = a.cfs.req(loc.aux.CFS, "cpu.stat")
	v.cfsQuota, _ = a.cfs.req(loc.aux.CFS, "cpu.cfs_quota_us")
	v.cfsPeriod, _ = a.cfs.req(loc.aux.CFS, "cpu.cfs_period_us")
	v.pidsCur, v.pidsWhy = a.pids.req(loc.aux.Pids, "pids.current")
	v.pidsMax, _ = a.pids.req(loc.aux.Pids, "pids.max")
	v.cpuPSI, v.psiWhy = a.unified.req(loc.aux.Unified, "cpu.pressure")
	v.memPSI, _ = a.unified.req(loc.aux.Unified, "memory.pressure")
	v.ioPSI, _ = a.unified.req(loc.aux.Unified, "io.pressure")
	v.blkBytes, v.blkWhy = a.blkio.req(loc.aux.Blkio, "blkio.throttle.io_service_bytes")
	v.blkIOs, _ = a.blkio.req(loc.aux.Blkio, "blkio.throttle.io_serviced")
	if v.blkBytes != nil {
		// The hierarchy's root lists the devices blk-throttle accounts
		// (blkio_v1.go).
		v.blkRoot, _ = a.blkio.req(ctlPath{Path: "/"}, "blkio.throttle.io_service_bytes")
	}
	return v
}

func (v v1Signals) reqs() []*fileReq {
	var out []*fileReq
	for _, f := range []*fileReq{v.memLimit, v.oomControl, v.cfsStat, v.cfsQuota, v.cfsPeriod, v.pidsCur, v.pidsMax,
		v.cpuPSI, v.memPSI, v.ioPSI, v.blkBytes, v.blkIOs, v.blkRoot} {
		if f != nil {
			out = append(out, f)
		}
	}
	return optional(out...)
}

func (v v1Signals) fill(r *source.Reading, pageSize uint64) error {
	if err := fillMemoryV1(r, v.memLimit, v.oomControl, pageSize); err != nil {
		return err
	}
	if err := fillThrottlingV1(r, v.cfsStat, v.cfsQuota, v.cfsPeriod, v.cfsWhy); err != nil {
		return err
	}
	if err := fillPressure(r, v.cpuPSI, v.memPSI, v.ioPSI, v.psiWhy); err != nil {
		return err
	}
	if err := fillPids(r, v.pidsCur, v.pidsMax, v.pidsWhy); err != nil {
		return err
	}
	return fillBlkioV1(r, v.blkBytes, v.blkIOs, v.blkRoot, v.blkWhy)
}

func fillMemoryV1(r *source.Reading, limitF, oomF *fileReq, pageSize uint64) error {
	p := part{name: "memory_signals"}
	m := &source.MemorySignals{}
	lim, ok, why, err := optParse(limitF, "", func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, pageSize) })
	if err != nil {
		return err
	}
	set(&p, &m.LimitBytes, lim, ok, "limit_bytes", why)
	p.absent("high_bytes", "cgroup v1 has no memory.high")
	oc, ok, why, err := optParse(oomF, "", parseKeyedMap)
	if err != nil {
		return err
	}
	keyed(&p, &m.OOMKills, oc, ok, "oom_kill", "oom_kills", why, func(key string) string { return oomF.path() + " has no " + key + " (Linux < 4.13)" })
	for _, f := range []string{"oom_group_kills", "oom_events", "max_events"} {
		p.absent(f, "cgroup v1 has no memory.events")
	}
	if ok {
		u, has := oc["under_oom"]
		if has && u > 1 {
			return oomF.malformed(fmt.Errorf("under_oom %d: want 0 or 1", u))
		}
		if has {
			set(&p, &m.UnderOOM, u == 1, true, "under_oom", "")
		} else {
			p.absent("under_oom", oomF.path()+" has no under_oom")
		}
	} else {
		p.absent("under_oom", why)
	}
	if p.done(r) {
		r.Memory = m
	}
	return nil
}

func fillThrottlingV1(r *source.Reading, statF, quotaF, periodF *fileReq, whyNil string) error {
	p := part{name: "cpu_throttling"}
	t := &source.CPUThrottling{}
	st, ok, why, err := optParse(statF, whyNil, parseKeyedMap)
	if err != nil {
		return err
	}
	has := func(key string) string {
		if statF == nil {
			return whyNil
		}
		return statF.path() + " has no " + key
	}
	keyed(&p, &t.Periods, st, ok, "nr_periods", "periods", why, has)
	keyed(&p, &t.ThrottledPeriods, st, ok, "nr_throttled", "throttled_periods", why, has)
	if ns, hasNs := st["throttled_time"]; ok && hasNs {
		usec := ns / nsPerUsec
		t.ThrottledUsec, p.present = &usec, true
	} else {
		keyed(&p, &t.ThrottledUsec, st, ok, "throttled_time", "throttled_usec", why, has)
	}
	q, ok, why, err := optParse(quotaF, whyNil, parseCFSQuota)
	if err != nil {
		return err
	}
	set(&p, &t.QuotaUsec, q, ok, "quota_usec", why)
	per, ok, why, err := optParse(periodF, whyNil, parseSingleUint)
	if err != nil {
		return err
	}
	set(&p, &t.PeriodUsec, per, ok, "period_usec", why)
	if p.done(r) {
		r.Throttling = t
	}
	return nil
}

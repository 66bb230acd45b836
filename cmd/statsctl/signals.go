package main

import (
	"fmt"
	"strings"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// signalRows prints the signals and traffic parts of s (memory limit and
// OOM kills, CPU throttling, pressure, pids, network, block IO), one figure
// a row with its unit and kind, through row. A part or field the sample
// lists as absent is printed "absent" with its reason; one it neither has
// nor lists (an older statsd) is not printed. It returns the absent fields
// it printed, for the caller not to list them again.
func signalRows(row func(k, v, note string), s *sandboxstatsv1.WorkloadStatsSample) map[string]bool {
	shown := map[string]bool{}
	why := func(field string) (string, bool) {
		for _, a := range s.GetAbsent() {
			if a.GetField() == field {
				shown[field] = true
				return a.GetReason(), true
			}
		}
		return "", false
	}
	absent := func(k, field string) {
		if reason, ok := why(field); ok {
			row(k, "absent", reason)
		}
	}
	counter := func(k, field string, v *uint64, note string) {
		if v == nil {
			absent(k, field)
			return
		}
		row(k, fmt.Sprint(*v), note)
	}
	usec := func(k, field string, v *uint64, note string) {
		if v == nil {
			absent(k, field)
			return
		}
		row(k, formatUsec(*v), note)
	}

	if ms := s.GetMemorySignals(); ms != nil {
		limitRow(row, absent, "MEMORY LIMIT", "memory_signals.limit_bytes", ms.GetLimitBytes(), "gauge; the limit in force")
		limitRow(row, absent, "MEMORY HIGH", "memory_signals.high_bytes", ms.GetHighBytes(), "gauge; reclaim throttles above it")
		counter("OOM KILLS", "memory_signals.oom_kills", ms.OomKills, "counter: processes the OOM killer killed, within the epoch")
		counter("OOM GROUP KILLS", "memory_signals.oom_group_kills", ms.OomGroupKills, "counter")
		counter("OOM EVENTS", "memory_signals.oom_events", ms.OomEvents, "counter: times the OOM killer was invoked")
		counter("LIMIT HITS", "memory_signals.max_events", ms.MaxEvents, "counter: times usage hit the limit")
		if ms.UnderOom != nil {
			row("UNDER OOM", yesNo(ms.GetUnderOom()), "gauge: tasks stopped on OOM now")
		} else {
			absent("UNDER OOM", "memory_signals.under_oom")
		}
	} else {
		absent("MEMORY LIMIT", "memory_signals")
	}

	if th := s.GetCpuThrottling(); th != nil {
		switch q := th.GetQuotaUsec(); {
		case q == nil:
			absent("CPU QUOTA", "cpu_throttling.quota_usec")
		case q.GetUnlimited():
			row("CPU QUOTA", "no quota", "gauge; CFS bandwidth never throttles it")
		case th.PeriodUsec != nil && th.GetPeriodUsec() > 0:
			row("CPU QUOTA", fmt.Sprintf("%d us per %d us period (%.2f CPUs)", q.GetValue(), th.GetPeriodUsec(), float64(q.GetValue())/float64(th.GetPeriodUsec())), "gauge")
		default:
			row("CPU QUOTA", fmt.Sprintf("%d us per period", q.GetValue()), "gauge")
		}
		counter("CPU PERIODS", "cpu_throttling.periods", th.Periods, "counter: enforcement periods with the cgroup runnable")
		counter("THROTTLED", "cpu_throttling.throttled_periods", th.ThrottledPeriods, "counter: periods in which the quota ran out")
		usec("THROTTLED TIME", "cpu_throttling.throttled_usec", th.ThrottledUsec, "counter: time kept from running by the quota")
	} else {
		absent("CPU QUOTA", "cpu_throttling")
	}

	if p := s.GetPressure(); p != nil {
		for _, r := range []struct {
			name  string
			stall *sandboxstatsv1.PressureStall
		}{{"cpu", p.GetCpu()}, {"memory", p.GetMemory()}, {"io", p.GetIo()}} {
			k := "PRESSURE " + strings.ToUpper(r.name)
			if r.stall == nil {
				absent(k, "pressure."+r.name)
				continue
			}
			usec(k+" WAITING", "pressure."+r.name+".some_usec", r.stall.SomeUsec, "counter: time some task waited (PSI some)")
			usec(k+" STALLED", "pressure."+r.name+".full_usec", r.stall.FullUsec, "counter: time all tasks stalled (PSI full)")
		}
	} else {
		absent("PRESSURE", "pressure")
	}

	if p := s.GetPids(); p != nil {
		switch l := p.GetLimit(); {
		case l == nil:
			row("PIDS", fmt.Sprint(p.GetCurrent()), "gauge")
			absent("PIDS LIMIT", "pids.limit")
		case l.GetUnlimited():
			row("PIDS", fmt.Sprintf("%d (no limit)", p.GetCurrent()), "gauge")
		default:
			row("PIDS", fmt.Sprintf("%d of %d", p.GetCurrent(), l.GetValue()), "gauge")
		}
	} else {
		absent("PIDS", "pids")
	}

	networkRows(row, absent, why, s.GetNetwork())
	blockIORows(row, absent, s.GetBlockIo())
	return shown
}

func limitRow(row func(k, v, note string), absent func(k, field string), k, field string, l *sandboxstatsv1.Limit, note string) {
	switch {
	case l == nil:
		absent(k, field)
	case l.GetUnlimited():
		row(k, "unlimited", "gauge; no limit in force")
	default:
		row(k, formatBytes(l.GetValue()), note)
	}
}

func networkRows(row func(k, v, note string), absent func(k, field string), why func(field string) (string, bool), n *sandboxstatsv1.NetworkStats) {
	if n == nil {
		absent("NETWORK", "network")
		return
	}
	layer := map[sandboxstatsv1.NetworkLayer]string{
		sandboxstatsv1.NetworkLayer_NETWORK_LAYER_HOST_NAMESPACE: "host side of the sandbox's network namespace",
		sandboxstatsv1.NetworkLayer_NETWORK_LAYER_GUEST:          "the guest's own counters",
	}[n.GetLayer()]
	if layer == "" {
		layer = "layer unspecified"
	}
	row("NETWORK", layer, n.GetOrigin())
	switch {
	case n.GetLoopbackOnly():
		note := "the sandbox has no network but loopback: no total, not a zero one"
		if reason, ok := why("network.total"); ok {
			note = reason
		}
		row("NET TOTAL", "loopback only", note)
	case n.GetTotal() != nil:
		row("NET TOTAL", ifaceCounters(n.GetTotal()), "counter, every interface but loopback")
	default:
		absent("NET TOTAL", "network.total")
	}
	for _, i := range n.GetInterfaces() {
		row("NET "+i.GetName(), ifaceCounters(i), "counter")
	}
	if lo := n.GetLoopback(); lo != nil {
		row("NET LOOPBACK", ifaceCounters(lo), "counter, never in the total")
	}
}

func ifaceCounters(c *sandboxstatsv1.InterfaceCounters) string {
	return fmt.Sprintf("rx %s %d packets %d errors %d dropped; tx %s %d packets %d errors %d dropped",
		formatBytes(c.GetRxBytes()), c.GetRxPackets(), c.GetRxErrors(), c.GetRxDropped(),
		formatBytes(c.GetTxBytes()), c.GetTxPackets(), c.GetTxErrors(), c.GetTxDropped())
}

func blockIORows(row func(k, v, note string), absent func(k, field string), b *sandboxstatsv1.BlockIo) {
	if b == nil {
		absent("BLOCK IO", "block_io")
		return
	}
	io := func(r, w, rios, wios uint64) string {
		return fmt.Sprintf("read %s %d ios; write %s %d ios", formatBytes(r), rios, formatBytes(w), wios)
	}
	note := "counter: only IO the kernel charges to the cgroup"
	if o := b.GetOrigin(); o != "" {
		note += "; " + o
	}
	row("BLOCK IO", io(b.GetReadBytes(), b.GetWriteBytes(), b.GetReadIos(), b.GetWriteIos()), note)
	for _, d := range b.GetDevices() {
		row(fmt.Sprintf("BLOCK IO %d:%d", d.GetMajor(), d.GetMinor()), io(d.GetReadBytes(), d.GetWriteBytes(), d.GetReadIos(), d.GetWriteIos()), "counter")
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

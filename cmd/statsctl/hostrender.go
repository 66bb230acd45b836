package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// writeHostSample prints one host sample as tables, each view under its
// legend and with its shortfall. Units are in the column names.
func writeHostSample(w io.Writer, hs *sandboxstatsv1.HostStats) error {
	hs = sanitized(hs)
	p := &printer{w: w}
	p.f("host view of guest %s (name from %s), observed %s\n", hs.GetGuestName(), hs.GetGuestNameSource(),
		time.Unix(0, hs.GetObservedAtUnixNano()).UTC().Format(time.RFC3339Nano))
	if hs.GetUnavailableReason() != "" {
		p.f("unavailable: %s\n", hs.GetUnavailableReason())
	}

	rk := hs.GetRunnerKernel()
	p.f("\n== %s: /proc/stat (counters) ==\nlegend: %s\n", rate.LayerRunnerKernel, rk.GetLegend())
	if rk.GetError() != "" {
		p.f("unavailable: %s\n", rk.GetError())
	} else {
		t := p.table()
		fmt.Fprintln(t, "CPU\tUSER_USEC\tNICE_USEC\tSYSTEM_USEC\tIDLE_USEC\tIOWAIT_USEC\tIRQ_USEC\tSOFTIRQ_USEC\tSTEAL_USEC\tGUEST_USEC\tGUEST_NICE_USEC")
		for _, c := range append([]*sandboxstatsv1.CpuTimes{rk.GetTotal()}, rk.GetPerCpu()...) {
			if c == nil {
				continue
			}
			fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", c.Cpu, c.UserUsec, c.NiceUsec, c.SystemUsec,
				c.IdleUsec, c.IowaitUsec, c.IrqUsec, c.SoftirqUsec, c.StealUsec, c.GuestUsec, c.GuestNiceUsec)
		}
		p.flush(t)
	}

	tv := hs.GetVmmThreads()
	p.f("\n== %s (counters; THREADS is a gauge) ==\nlegend: %s\n", rate.LayerVMMThreads, tv.GetLegend())
	if tv.GetProcessSource() != "" {
		p.f("processes: %s, pids %v, USER_HZ %d\n", tv.GetProcessSource(), tv.GetPids(), tv.GetUserHz())
	}
	if tv.GetError() != "" {
		p.f("unavailable: %s\n", tv.GetError())
	} else {
		t := p.table()
		fmt.Fprintln(t, "PID\tTID\tNAME\tCLASS\tSTART_TICKS\tUTIME_USEC\tSTIME_USEC\tGUEST_USEC\tRUN_NS\tRUN_DELAY_NS\tRUN_COUNT")
		for _, th := range tv.GetThreads() {
			fmt.Fprintf(t, "%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", th.Pid, th.Tid, th.Name, threadClassName(th), th.StartTimeTicks,
				th.UtimeUsec, th.StimeUsec, th.GuestTimeUsec, opt(th.RunNs), opt(th.RunDelayNs), opt(th.RunCount))
		}
		p.flush(t)
		t = p.table()
		fmt.Fprintln(t, "TOTAL\tTHREADS\tUTIME_USEC\tSTIME_USEC\tGUEST_USEC\tRUN_NS\tRUN_DELAY_NS")
		for _, s := range []*sandboxstatsv1.VmmThreadTotals{tv.GetVcpuTotals(), tv.GetOtherTotals()} {
			if s == nil {
				continue
			}
			name := "other"
			if s.Class == sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU {
				name = "vcpu"
			}
			run, delay := strconv.FormatUint(s.RunNs, 10), strconv.FormatUint(s.RunDelayNs, 10)
			if s.Threads > 0 && !anySchedstat(tv.GetThreads(), s.Class) {
				run, delay = "-", "-" // unknown, not 0
			}
			fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", name, s.Threads, s.UtimeUsec, s.StimeUsec, s.GuestTimeUsec, run, delay)
		}
		p.flush(t)
		for _, tid := range tv.GetReusedTids() {
			p.f("finding: tid %d was reused since the previous sample (new start time): its counters restarted\n", tid)
		}
		for _, e := range tv.GetThreadErrors() {
			p.f("thread shortfall: %s\n", e)
		}
	}

	kv := hs.GetKvm()
	p.f("\n== KVM ==\nlegend: %s\n", kv.GetLegend())
	for _, v := range []*sandboxstatsv1.KvmSourceView{kv.GetDebugfs(), kv.GetQmp()} {
		if v == nil {
			continue
		}
		p.f("\n-- %s: %s", api.KVMSourceName(v.Source), api.KVMStateName(v.State))
		if v.Origin != "" {
			p.f(" (%s)", v.Origin)
		}
		p.f(" --\n")
		if v.Reason != "" {
			p.f("reason: %s\n", v.Reason)
		}
		if len(v.Counters) > 0 {
			t := p.table()
			fmt.Fprintln(t, "SCOPE\tNAME\tKIND\tVALUE\tUNIT")
			for _, c := range v.Counters {
				fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%s\n", c.Scope, c.Name, api.KVMCounterKindName(c.Kind), c.Value, c.Unit)
			}
			p.flush(t)
		}
		for _, a := range v.Absent {
			p.f("absent: %s\n", a)
		}
	}
	return p.err
}

// writeHostWindow prints a window: per layer its legend and the cumulative
// counters' differences and rates, then the findings.
func writeHostWindow(w io.Writer, r rate.WindowReport) error {
	r = sanitizedWindow(r)
	p := &printer{w: w}
	p.f("host window of guest %s over %s: differences of cumulative counters only\n", r.GuestName, r.Elapsed)
	for _, layer := range []string{rate.LayerRunnerKernel, rate.LayerVMMThreads, rate.LayerKVMDebugfs, rate.LayerKVMQMP} {
		var rows []rate.WindowRow
		for _, row := range r.Rows {
			if row.Layer == layer {
				rows = append(rows, row)
			}
		}
		if len(rows) == 0 {
			continue
		}
		p.f("\n== %s ==\nlegend: %s\n", layer, r.Legends[layer])
		t := p.table()
		fmt.Fprintln(t, "NAME\tUNIT\tBEFORE\tAFTER\tDELTA\tRATE_PER_S")
		for _, row := range rows {
			fmt.Fprintf(t, "%s\t%s\t%d\t%d\t%d\t%s\n", row.Name, row.Unit, row.Before, row.After, row.Delta, formatRate(row.RatePerSec, row.Unit))
		}
		p.flush(t)
	}
	if len(r.Findings) > 0 {
		p.f("\nfindings:\n")
		for _, f := range r.Findings {
			p.f("- %s\n", f)
		}
	}
	return p.err
}

func formatRate(v float64, unit string) string {
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit + "/s"
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) table() *tabwriter.Writer {
	return tabwriter.NewWriter(&errWriter{p: p}, 0, 0, 2, ' ', 0)
}

func (p *printer) flush(t *tabwriter.Writer) {
	if err := t.Flush(); err != nil && p.err == nil {
		p.err = err
	}
}

type errWriter struct{ p *printer }

func (e *errWriter) Write(b []byte) (int, error) {
	if e.p.err != nil {
		return 0, e.p.err
	}
	n, err := e.p.w.Write(b)
	e.p.err = err
	return n, err
}

func opt(v *uint64) string {
	if v == nil {
		return "absent"
	}
	return strconv.FormatUint(*v, 10)
}

func threadClassName(th *sandboxstatsv1.VmmThread) string {
	if th.Class == sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU {
		return "vcpu" + strconv.Itoa(int(th.GetVcpuIndex()))
	}
	return "other"
}

// anySchedstat reports whether some thread of class had its schedstat read.
func anySchedstat(ths []*sandboxstatsv1.VmmThread, class sandboxstatsv1.VmmThreadClass) bool {
	for _, th := range ths {
		if th.Class == class && th.RunNs != nil {
			return true
		}
	}
	return false
}

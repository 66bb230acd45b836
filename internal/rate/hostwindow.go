package rate

import (
	"fmt"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Layers of host window rows, in print order.
const (
	LayerRunnerKernel = "runner kernel"
	LayerVMMThreads   = "VMM threads"
	LayerKVMDebugfs   = "KVM debugfs"
	LayerKVMQMP       = "KVM qmp"
)

// WindowReport is the difference between two host samples of one sandbox
// (HostStats as StatsHost returns them; `statsctl host --window` prints it):
// cumulative counters only, each with its unit and rate. A counter that
// decreased is a finding (reset, thread exit, VM replaced), never a rate;
// gauges and peaks never appear.
type WindowReport struct {
	// Elapsed is the interval rates are computed over.
	Elapsed   time.Duration `json:"elapsed_ns"`
	GuestName string        `json:"guest_name"`
	// Legends maps each layer to how its rows must be read.
	Legends map[string]string `json:"legends"`
	Rows    []WindowRow       `json:"rows"`
	// Findings are the things that broke a difference: decreases, threads
	// that came, went or reused a tid, views that were short in either
	// sample.
	Findings []string `json:"findings,omitempty"`
}

// WindowRow is one cumulative counter across the window.
type WindowRow struct {
	Layer  string `json:"layer"`
	Name   string `json:"name"`
	Unit   string `json:"unit"`
	Before uint64 `json:"before"`
	After  uint64 `json:"after"`
	Delta  uint64 `json:"delta"`
	// RatePerSec is Delta per second of Elapsed, in Unit per second.
	RatePerSec float64 `json:"rate_per_sec"`
}

const (
	legendWindowKernel  = "host-wide CPU time in usec, rate in usec/s (1e6 usec/s = one CPU busy); user includes guest; steal only with a paravirt steal clock (zero proves nothing)"
	legendWindowThreads = "VMM threads present in both samples (same tid and start time); cpu = utime+stime in usec at 10 ms resolution; run and run_delay in ns from schedstat; a vCPU's run_delay is host-side steal"
	legendWindowKVM     = "cumulative KVM counters of this VM only; gauges and peaks are not differenced"
)

// Window differences two samples of the same sandbox taken elapsed apart
// (when elapsed is 0 the samples' observed_at difference is used).
func Window(before, after *sandboxstatsv1.HostStats, elapsed time.Duration) WindowReport {
	if elapsed <= 0 {
		elapsed = time.Duration(after.GetObservedAtUnixNano() - before.GetObservedAtUnixNano())
	}
	w := &windowBuilder{r: WindowReport{
		Elapsed:   elapsed,
		GuestName: after.GetGuestName(),
		Legends: map[string]string{
			LayerRunnerKernel: legendWindowKernel,
			LayerVMMThreads:   legendWindowThreads,
			LayerKVMDebugfs:   legendWindowKVM,
			LayerKVMQMP:       legendWindowKVM,
		},
	}}
	if before.GetGuestName() != after.GetGuestName() {
		w.finding("guest name changed from %q to %q: the samples may describe different guests", before.GetGuestName(), after.GetGuestName())
	}
	w.kernel(before.GetRunnerKernel(), after.GetRunnerKernel())
	w.threads(before.GetVmmThreads(), after.GetVmmThreads())
	w.kvm(LayerKVMDebugfs, before.GetKvm().GetDebugfs(), after.GetKvm().GetDebugfs())
	w.kvm(LayerKVMQMP, before.GetKvm().GetQmp(), after.GetKvm().GetQmp())
	return w.r
}

type windowBuilder struct{ r WindowReport }

func (w *windowBuilder) finding(format string, args ...any) {
	w.r.Findings = append(w.r.Findings, fmt.Sprintf(format, args...))
}

// counter adds one row, or a finding when the counter decreased.
func (w *windowBuilder) counter(layer, name, unit string, before, after uint64) {
	if after < before {
		w.finding("%s %s decreased from %d to %d %s: reset or restart, no rate", layer, name, before, after, unit)
		return
	}
	row := WindowRow{Layer: layer, Name: name, Unit: unit, Before: before, After: after, Delta: after - before}
	if s := w.r.Elapsed.Seconds(); s > 0 {
		row.RatePerSec = float64(row.Delta) / s
	}
	w.r.Rows = append(w.r.Rows, row)
}

func (w *windowBuilder) kernel(b, a *sandboxstatsv1.RunnerKernelView) {
	if b.GetError() != "" || a.GetError() != "" || b.GetTotal() == nil || a.GetTotal() == nil {
		w.finding("%s: not differenced: before %q, after %q", LayerRunnerKernel, shortfall(b.GetError(), b.GetTotal() == nil), shortfall(a.GetError(), a.GetTotal() == nil))
		return
	}
	bt, at := b.GetTotal(), a.GetTotal()
	for _, c := range []struct {
		name string
		b, a uint64
	}{
		{"cpu user", bt.UserUsec, at.UserUsec},
		{"cpu nice", bt.NiceUsec, at.NiceUsec},
		{"cpu system", bt.SystemUsec, at.SystemUsec},
		{"cpu idle", bt.IdleUsec, at.IdleUsec},
		{"cpu iowait", bt.IowaitUsec, at.IowaitUsec},
		{"cpu irq", bt.IrqUsec, at.IrqUsec},
		{"cpu softirq", bt.SoftirqUsec, at.SoftirqUsec},
		{"cpu steal", bt.StealUsec, at.StealUsec},
		{"cpu guest", bt.GuestUsec, at.GuestUsec},
		{"cpu guest_nice", bt.GuestNiceUsec, at.GuestNiceUsec},
	} {
		w.counter(LayerRunnerKernel, c.name, "usec", c.b, c.a)
	}
}

func shortfall(err string, missing bool) string {
	if err != "" {
		return err
	}
	if missing {
		return "view missing"
	}
	return ""
}

type threadKey struct {
	pid, tid int32
	start    uint64
}

func (w *windowBuilder) threads(b, a *sandboxstatsv1.VmmThreadsView) {
	if b.GetError() != "" || a.GetError() != "" || b == nil || a == nil {
		w.finding("%s: not differenced: before %q, after %q", LayerVMMThreads, shortfall(b.GetError(), b == nil), shortfall(a.GetError(), a == nil))
		return
	}
	prev := make(map[threadKey]*sandboxstatsv1.VmmThread, len(b.Threads))
	prevTid := make(map[int32]*sandboxstatsv1.VmmThread, len(b.Threads))
	for _, th := range b.Threads {
		prev[threadKey{th.Pid, th.Tid, th.StartTimeTicks}] = th
		prevTid[th.Tid] = th
	}
	type sums struct{ cpuB, cpuA, guestB, guestA, runB, runA, delayB, delayA uint64 }
	var vcpu, other sums
	var nVCPU, nOther int
	seen := make(map[threadKey]bool, len(a.Threads))
	for _, th := range a.Threads {
		k := threadKey{th.Pid, th.Tid, th.StartTimeTicks}
		seen[k] = true
		p, ok := prev[k]
		if !ok {
			if old, reused := prevTid[th.Tid]; reused {
				w.finding("%s: tid %d reused (%q started at tick %d, now %q at tick %d): not differenced", LayerVMMThreads, th.Tid, old.Name, old.StartTimeTicks, th.Name, th.StartTimeTicks)
			} else {
				w.finding("%s: thread %d %q appeared during the window: not differenced", LayerVMMThreads, th.Tid, th.Name)
			}
			continue
		}
		label := fmt.Sprintf("%d %s", th.Tid, th.Name)
		w.counter(LayerVMMThreads, label+" cpu", "usec", p.UtimeUsec+p.StimeUsec, th.UtimeUsec+th.StimeUsec)
		sched := p.RunNs != nil && th.RunNs != nil
		if sched {
			w.counter(LayerVMMThreads, label+" run", "ns", p.GetRunNs(), th.GetRunNs())
			w.counter(LayerVMMThreads, label+" run_delay", "ns", p.GetRunDelayNs(), th.GetRunDelayNs())
		}
		s := &other
		if th.Class == sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU {
			s = &vcpu
			nVCPU++
		} else {
			nOther++
		}
		s.cpuB += p.UtimeUsec + p.StimeUsec
		s.cpuA += th.UtimeUsec + th.StimeUsec
		s.guestB += p.GuestTimeUsec
		s.guestA += th.GuestTimeUsec
		if sched {
			s.runB += p.GetRunNs()
			s.runA += th.GetRunNs()
			s.delayB += p.GetRunDelayNs()
			s.delayA += th.GetRunDelayNs()
		}
	}
	for _, th := range b.Threads {
		if !seen[threadKey{th.Pid, th.Tid, th.StartTimeTicks}] {
			w.finding("%s: thread %d %q exited during the window: its last interval is lost", LayerVMMThreads, th.Tid, th.Name)
		}
	}
	for _, c := range []struct {
		name string
		n    int
		s    sums
	}{{"vcpu threads", nVCPU, vcpu}, {"other threads", nOther, other}} {
		if c.n == 0 {
			continue
		}
		label := fmt.Sprintf("total %s (%d)", c.name, c.n)
		w.counter(LayerVMMThreads, label+" cpu", "usec", c.s.cpuB, c.s.cpuA)
		w.counter(LayerVMMThreads, label+" guest", "usec", c.s.guestB, c.s.guestA)
		w.counter(LayerVMMThreads, label+" run", "ns", c.s.runB, c.s.runA)
		w.counter(LayerVMMThreads, label+" run_delay", "ns", c.s.delayB, c.s.delayA)
	}
}

func (w *windowBuilder) kvm(layer string, b, a *sandboxstatsv1.KvmSourceView) {
	ok := func(v *sandboxstatsv1.KvmSourceView) bool {
		return v.GetState() == sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE ||
			v.GetState() == sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL
	}
	if !ok(b) || !ok(a) {
		if b.GetState() == sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED &&
			a.GetState() == sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED {
			return
		}
		w.finding("%s: not differenced: before %s %q, after %s %q", layer, api.KVMStateName(b.GetState()), b.GetReason(), api.KVMStateName(a.GetState()), a.GetReason())
		return
	}
	if b.GetOrigin() != a.GetOrigin() {
		w.finding("%s: origin changed from %q to %q (a new VM): not differenced", layer, b.GetOrigin(), a.GetOrigin())
		return
	}
	prev := make(map[string]*sandboxstatsv1.KvmCounter, len(b.Counters))
	for _, c := range b.Counters {
		prev[c.Scope+"\x00"+c.Name] = c
	}
	for _, c := range a.Counters {
		if c.Kind != sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE {
			continue
		}
		p, found := prev[c.Scope+"\x00"+c.Name]
		if !found {
			w.finding("%s: %s %s absent before the window", layer, c.Scope, c.Name)
			continue
		}
		w.counter(layer, c.Scope+" "+c.Name, c.Unit, p.Value, c.Value)
	}
}

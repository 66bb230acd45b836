package server

// This file converts the host views (source.HostStats, built by hoststat) to
// their wire form, field by field. A nil view stays absent on the wire.

import (
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func hostToProto(h *source.HostStats) *sandboxstatsv1.HostStats {
	if h == nil {
		return nil
	}
	return &sandboxstatsv1.HostStats{
		ObservedAtUnixNano: h.ObservedAtUnixNano,
		UnavailableReason:  h.UnavailableReason,
		GuestName:          h.GuestName,
		GuestNameSource:    h.GuestNameSource,
		RunnerKernel:       runnerKernelToProto(h.RunnerKernel),
		VmmThreads:         threadsToProto(h.VMMThreads),
		Kvm:                kvmToProto(h.KVM),
	}
}

func runnerKernelToProto(v *source.RunnerKernelView) *sandboxstatsv1.RunnerKernelView {
	if v == nil {
		return nil
	}
	out := &sandboxstatsv1.RunnerKernelView{Legend: v.Legend, Error: v.Error, Total: cpuTimesToProto(v.Total)}
	for i := range v.PerCPU {
		out.PerCpu = append(out.PerCpu, cpuTimesToProto(&v.PerCPU[i]))
	}
	return out
}

func cpuTimesToProto(c *source.CPUTimes) *sandboxstatsv1.CpuTimes {
	if c == nil {
		return nil
	}
	return &sandboxstatsv1.CpuTimes{
		Cpu:           c.CPU,
		UserUsec:      c.UserUsec,
		NiceUsec:      c.NiceUsec,
		SystemUsec:    c.SystemUsec,
		IdleUsec:      c.IdleUsec,
		IowaitUsec:    c.IowaitUsec,
		IrqUsec:       c.IRQUsec,
		SoftirqUsec:   c.SoftIRQUsec,
		StealUsec:     c.StealUsec,
		GuestUsec:     c.GuestUsec,
		GuestNiceUsec: c.GuestNiceUsec,
	}
}

func threadsToProto(v *source.VMMThreadsView) *sandboxstatsv1.VmmThreadsView {
	if v == nil {
		return nil
	}
	out := &sandboxstatsv1.VmmThreadsView{
		Legend:        v.Legend,
		Error:         v.Error,
		ProcessSource: v.ProcessSource,
		Pids:          v.PIDs,
		VcpuTotals:    totalsToProto(v.VCPUTotals),
		OtherTotals:   totalsToProto(v.OtherTotals),
		ReusedTids:    v.ReusedTIDs,
		ThreadErrors:  v.ThreadErrors,
		UserHz:        v.UserHZ,
	}
	for i := range v.Threads {
		th := &v.Threads[i]
		out.Threads = append(out.Threads, &sandboxstatsv1.VmmThread{
			Pid:            th.PID,
			Tid:            th.TID,
			Name:           th.Name,
			StartTimeTicks: th.StartTimeTicks,
			Class:          threadClassToProto(th.Class),
			VcpuIndex:      th.VCPUIndex,
			UtimeUsec:      th.UtimeUsec,
			StimeUsec:      th.StimeUsec,
			GuestTimeUsec:  th.GuestTimeUsec,
			RunNs:          th.RunNs,
			RunDelayNs:     th.RunDelayNs,
			RunCount:       th.RunCount,
		})
	}
	return out
}

func totalsToProto(t *source.VMMThreadTotals) *sandboxstatsv1.VmmThreadTotals {
	if t == nil {
		return nil
	}
	return &sandboxstatsv1.VmmThreadTotals{
		Class:         threadClassToProto(t.Class),
		Threads:       t.Threads,
		UtimeUsec:     t.UtimeUsec,
		StimeUsec:     t.StimeUsec,
		GuestTimeUsec: t.GuestTimeUsec,
		RunNs:         t.RunNs,
		RunDelayNs:    t.RunDelayNs,
	}
}

func kvmToProto(v *source.KVMView) *sandboxstatsv1.KvmView {
	if v == nil {
		return nil
	}
	return &sandboxstatsv1.KvmView{Legend: v.Legend, Debugfs: kvmSourceToProto(v.Debugfs), Qmp: kvmSourceToProto(v.QMP)}
}

func kvmSourceToProto(v *source.KVMSourceView) *sandboxstatsv1.KvmSourceView {
	if v == nil {
		return nil
	}
	out := &sandboxstatsv1.KvmSourceView{
		Source: kvmSourceKindToProto(v.Source),
		State:  kvmStateToProto(v.State),
		Reason: v.Reason,
		Origin: v.Origin,
		Absent: v.Absent,
	}
	for _, c := range v.Counters {
		out.Counters = append(out.Counters, &sandboxstatsv1.KvmCounter{
			Name: c.Name, Kind: counterKindToProto(c.Kind), Scope: c.Scope, Value: c.Value, Unit: c.Unit,
		})
	}
	return out
}

// The domain's host enums are numbered like the wire's (TestHostEnumsToProto
// holds it), so they convert by number.
func threadClassToProto(c source.VMMThreadClass) sandboxstatsv1.VmmThreadClass {
	return sandboxstatsv1.VmmThreadClass(c)
}

func counterKindToProto(k source.KVMCounterKind) sandboxstatsv1.KvmCounterKind {
	return sandboxstatsv1.KvmCounterKind(k)
}

func kvmSourceKindToProto(s source.KVMSource) sandboxstatsv1.KvmSource {
	return sandboxstatsv1.KvmSource(s)
}

func kvmStateToProto(s source.KVMSourceState) sandboxstatsv1.KvmSourceState {
	return sandboxstatsv1.KvmSourceState(s)
}

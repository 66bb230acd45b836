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

func threadClassToProto(c source.VMMThreadClass) sandboxstatsv1.VmmThreadClass {
	switch c {
	case source.VMMThreadClassVCPU:
		return sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU
	case source.VMMThreadClassOther:
		return sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_OTHER
	default:
		return sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_UNSPECIFIED
	}
}

func counterKindToProto(k source.KVMCounterKind) sandboxstatsv1.KvmCounterKind {
	switch k {
	case source.KVMCounterKindCumulative:
		return sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE
	case source.KVMCounterKindGauge:
		return sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_GAUGE
	case source.KVMCounterKindPeak:
		return sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_PEAK
	default:
		return sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_UNSPECIFIED
	}
}

func kvmSourceKindToProto(s source.KVMSource) sandboxstatsv1.KvmSource {
	switch s {
	case source.KVMSourceDebugfs:
		return sandboxstatsv1.KvmSource_KVM_SOURCE_DEBUGFS
	case source.KVMSourceQMP:
		return sandboxstatsv1.KvmSource_KVM_SOURCE_QMP
	default:
		return sandboxstatsv1.KvmSource_KVM_SOURCE_UNSPECIFIED
	}
}

func kvmStateToProto(s source.KVMSourceState) sandboxstatsv1.KvmSourceState {
	switch s {
	case source.KVMSourceStateAvailable:
		return sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE
	case source.KVMSourceStatePartial:
		return sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL
	case source.KVMSourceStateUnavailable:
		return sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE
	case source.KVMSourceStateNotConfigured:
		return sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED
	default:
		return sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNSPECIFIED
	}
}

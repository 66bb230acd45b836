package server

import (
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// signalsToProto fills the signals and traffic parts of s from r.
func signalsToProto(s *sandboxstatsv1.WorkloadStatsSample, r source.Reading) {
	s.MemorySignals = memoryToProto(r.Memory)
	s.CpuThrottling = throttlingToProto(r.Throttling)
	s.Pressure = pressureToProto(r.Pressure)
	s.Pids = pidsToProto(r.Pids)
	s.Network = networkToProto(r.Network)
	s.BlockIo = blockIOToProto(r.BlockIO)
}

func limitToProto(l *source.Limit) *sandboxstatsv1.Limit {
	if l == nil {
		return nil
	}
	return &sandboxstatsv1.Limit{Unlimited: l.Unlimited, Value: l.Value}
}

func memoryToProto(m *source.MemorySignals) *sandboxstatsv1.MemorySignals {
	if m == nil {
		return nil
	}
	return &sandboxstatsv1.MemorySignals{
		LimitBytes:    limitToProto(m.LimitBytes),
		HighBytes:     limitToProto(m.HighBytes),
		OomKills:      m.OOMKills,
		OomGroupKills: m.OOMGroupKills,
		OomEvents:     m.OOMEvents,
		MaxEvents:     m.MaxEvents,
		UnderOom:      m.UnderOOM,
	}
}

func throttlingToProto(t *source.CPUThrottling) *sandboxstatsv1.CpuThrottling {
	if t == nil {
		return nil
	}
	return &sandboxstatsv1.CpuThrottling{
		Periods:          t.Periods,
		ThrottledPeriods: t.ThrottledPeriods,
		ThrottledUsec:    t.ThrottledUsec,
		QuotaUsec:        limitToProto(t.QuotaUsec),
		PeriodUsec:       t.PeriodUsec,
	}
}

func stallToProto(p *source.PressureStall) *sandboxstatsv1.PressureStall {
	if p == nil {
		return nil
	}
	return &sandboxstatsv1.PressureStall{SomeUsec: p.SomeUsec, FullUsec: p.FullUsec}
}

func pressureToProto(p *source.Pressure) *sandboxstatsv1.Pressure {
	if p == nil {
		return nil
	}
	return &sandboxstatsv1.Pressure{Cpu: stallToProto(p.CPU), Memory: stallToProto(p.Memory), Io: stallToProto(p.IO)}
}

func pidsToProto(p *source.Pids) *sandboxstatsv1.Pids {
	if p == nil {
		return nil
	}
	return &sandboxstatsv1.Pids{Current: p.Current, Limit: limitToProto(p.Limit)}
}

func ifaceToProto(c source.InterfaceCounters) *sandboxstatsv1.InterfaceCounters {
	return &sandboxstatsv1.InterfaceCounters{
		Name:    c.Name,
		RxBytes: c.RxBytes, RxPackets: c.RxPackets, RxErrors: c.RxErrors, RxDropped: c.RxDropped,
		TxBytes: c.TxBytes, TxPackets: c.TxPackets, TxErrors: c.TxErrors, TxDropped: c.TxDropped,
	}
}

func networkToProto(n *source.Network) *sandboxstatsv1.NetworkStats {
	if n == nil {
		return nil
	}
	out := &sandboxstatsv1.NetworkStats{
		Layer:        sandboxstatsv1.NetworkLayer(n.Layer), // numbered alike (TestEnumsMatchTheWire)
		Origin:       n.Origin,
		LoopbackOnly: n.LoopbackOnly,
	}
	if n.Total != nil {
		out.Total = ifaceToProto(*n.Total)
	}
	if n.Loopback != nil {
		out.Loopback = ifaceToProto(*n.Loopback)
	}
	for _, c := range n.Interfaces {
		out.Interfaces = append(out.Interfaces, ifaceToProto(c))
	}
	return out
}

func blockIOToProto(b *source.BlockIO) *sandboxstatsv1.BlockIo {
	if b == nil {
		return nil
	}
	out := &sandboxstatsv1.BlockIo{
		ReadBytes: b.ReadBytes, WriteBytes: b.WriteBytes, ReadIos: b.ReadIOs, WriteIos: b.WriteIOs, Origin: b.Origin,
	}
	for _, d := range b.Devices {
		out.Devices = append(out.Devices, &sandboxstatsv1.DeviceIo{
			Major: d.Major, Minor: d.Minor, ReadBytes: d.ReadBytes, WriteBytes: d.WriteBytes, ReadIos: d.ReadIOs, WriteIos: d.WriteIOs,
		})
	}
	return out
}

package server

import (
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// signalsToProto fills the signals and traffic parts of s from r; the
// messages of its memory, throttling and pids signals are b's.
func signalsToProto(s *sandboxstatsv1.WorkloadStatsSample, r source.Reading, b *signalBlocks) {
	s.MemorySignals = b.memory.of(r.Memory)
	s.CpuThrottling = b.throttling.of(r.Throttling)
	s.Pressure = pressureToProto(r.Pressure)
	s.Pids = b.pids.of(r.Pids)
	s.Network = networkToProto(r.Network)
	s.BlockIo = blockIOToProto(r.BlockIO)
}

// signalBlocks hold the messages of the signals most samples carry, made
// with their sample in one allocation (readingToSample).
type signalBlocks struct {
	memory     memoryBlock
	throttling throttlingBlock
	pids       pidsBlock
}

// limitInto sets *dst to l and returns dst (nil for nil).
func limitInto(dst *sandboxstatsv1.Limit, l *source.Limit) *sandboxstatsv1.Limit {
	if l == nil {
		return nil
	}
	dst.Unlimited, dst.Value = l.Unlimited, l.Value
	return dst
}

type memoryBlock struct {
	m           sandboxstatsv1.MemorySignals
	limit, high sandboxstatsv1.Limit
}

// of is m as b's message (nil for nil).
func (b *memoryBlock) of(m *source.MemorySignals) *sandboxstatsv1.MemorySignals {
	if m == nil {
		return nil
	}
	b.m.LimitBytes = limitInto(&b.limit, m.LimitBytes)
	b.m.HighBytes = limitInto(&b.high, m.HighBytes)
	b.m.OomKills, b.m.OomGroupKills, b.m.OomEvents, b.m.MaxEvents, b.m.UnderOom = m.OOMKills, m.OOMGroupKills, m.OOMEvents, m.MaxEvents, m.UnderOOM
	return &b.m
}

type throttlingBlock struct {
	t     sandboxstatsv1.CpuThrottling
	quota sandboxstatsv1.Limit
}

// of is t as b's message (nil for nil).
func (b *throttlingBlock) of(t *source.CPUThrottling) *sandboxstatsv1.CpuThrottling {
	if t == nil {
		return nil
	}
	b.t.Periods, b.t.ThrottledPeriods, b.t.ThrottledUsec, b.t.PeriodUsec = t.Periods, t.ThrottledPeriods, t.ThrottledUsec, t.PeriodUsec
	b.t.QuotaUsec = limitInto(&b.quota, t.QuotaUsec)
	return &b.t
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

type pidsBlock struct {
	p     sandboxstatsv1.Pids
	limit sandboxstatsv1.Limit
}

// of is p as b's message (nil for nil).
func (b *pidsBlock) of(p *source.Pids) *sandboxstatsv1.Pids {
	if p == nil {
		return nil
	}
	b.p.Current, b.p.Limit = p.Current, limitInto(&b.limit, p.Limit)
	return &b.p
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

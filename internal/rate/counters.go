package rate

import (
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Counter is one counter of a sample that the Accountant charges: CPU, and
// the counters of the signals and traffic parts (proto signals.proto).
type Counter int

// The counters, in the order the Accountant charges them: first those with
// a bound on what a time window allows (whose head can show a source
// reused with a history), then the others, then the sandbox's own CPU
// (added later, numbered last).
const (
	CounterCPU              Counter = iota // cpu_usage_usec, µs
	CounterThrottledUsec                   // cpu_throttling.throttled_usec, µs
	CounterPressureCPUSome                 // pressure.cpu.some_usec, µs
	CounterPressureCPUFull                 // pressure.cpu.full_usec, µs
	CounterPressureMemSome                 // pressure.memory.some_usec, µs
	CounterPressureMemFull                 // pressure.memory.full_usec, µs
	CounterPressureIOSome                  // pressure.io.some_usec, µs
	CounterPressureIOFull                  // pressure.io.full_usec, µs
	CounterPeriods                         // cpu_throttling.periods
	CounterThrottledPeriods                // cpu_throttling.throttled_periods
	CounterOOMKills                        // memory_signals.oom_kills
	CounterNetRxBytes                      // network rx_bytes (total, or per interface)
	CounterNetRxPackets
	CounterNetRxErrors
	CounterNetRxDropped
	CounterNetTxBytes
	CounterNetTxPackets
	CounterNetTxErrors
	CounterNetTxDropped
	CounterIOReadBytes // block_io.read_bytes
	CounterIOWriteBytes
	CounterIOReadOps // block_io.read_ios
	CounterIOWriteOps
	// CounterSandboxOwnCPU: sandbox_own_cpu_usec, µs (gVisor: the
	// sentry's and gofers' host CPU and the pause container's part). Last
	// so that the counters' numbers, which a state file holds, stay those
	// of the builds before it; CPU-time bounded like CounterCPU.
	CounterSandboxOwnCPU
	NumCounters // the number of counters, not a counter
)

// bound says what a window of wall time allows a counter to have grown by.
type bound int

const (
	// boundCPUTime: at most CPUs x the window (µs of CPU or of stall).
	boundCPUTime bound = iota
	// boundPeriods: at most one per millisecond (the shortest CFS period).
	boundPeriods
	// boundBytes: at most MaxBytesPerSecond per second of the window (a
	// plausibility bound, far above any real device: it refuses lies, it
	// never shows a history).
	boundBytes
	// boundCount: at most MaxCountsPerSecond per second of the window
	// (packets, errors, drops, IOs, OOM kills; a plausibility bound too).
	boundCount
)

// tight reports whether b is a bound a real counter can come close to,
// so that a head past it shows a source reused with a history (CPU and
// stall time, periods); the plausibility bounds (bytes, counts) only
// refuse.
func (b bound) tight() bool { return b == boundCPUTime || b == boundPeriods }

// The plausibility bounds of the counters that have no bound of their own
// in CPU time: generous by orders of magnitude (1 TiB/s is about 20 times
// a 400 Gb/s NIC and far beyond any disk; 2^32 packets or IOs a second is
// about 7 times the packets of a 400 Gb/s NIC at its smallest frames), so
// that only a broken or hostile daemon's counter is refused, and one
// workload can add at most about 2^46 bytes to a shared series per minute
// of its time.
const (
	MaxBytesPerSecond  = 1 << 40
	MaxCountsPerSecond = 1 << 32
)

type counterSpec struct {
	field string // as the sample's absent list names it
	bound bound
	// get returns the counter's value in s, and whether s carries it.
	get func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool)
	// iface, for a network counter, returns it from one interface.
	iface func(c *sandboxstatsv1.InterfaceCounters) uint64
}

func opt(p *uint64) (uint64, bool) {
	if p == nil {
		return 0, false
	}
	return *p, true
}

func stall(p *sandboxstatsv1.PressureStall, full bool) (uint64, bool) {
	switch {
	case p == nil:
		return 0, false
	case full:
		return opt(p.FullUsec)
	}
	return opt(p.SomeUsec)
}

func throttling(s *sandboxstatsv1.WorkloadStatsSample, f func(*sandboxstatsv1.CpuThrottling) *uint64) (uint64, bool) {
	if t := s.GetCpuThrottling(); t != nil {
		return opt(f(t))
	}
	return 0, false
}

// net returns a network counter spec reading field f of the total (absent
// when the sample has no total: no network, or loopback only).
func net(field string, f func(c *sandboxstatsv1.InterfaceCounters) uint64) counterSpec {
	return counterSpec{field: "network.total." + field, bound: bytesOrCount(field), iface: f, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		if t := s.GetNetwork().GetTotal(); t != nil {
			return f(t), true
		}
		return 0, false
	}}
}

func blockIO(field string, f func(b *sandboxstatsv1.BlockIo) uint64) counterSpec {
	return counterSpec{field: "block_io." + field, bound: bytesOrCount(field), get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		if b := s.GetBlockIo(); b != nil {
			return f(b), true
		}
		return 0, false
	}}
}

// bytesOrCount returns the plausibility bound of a counter named field.
func bytesOrCount(field string) bound {
	if strings.HasSuffix(field, "_bytes") {
		return boundBytes
	}
	return boundCount
}

var counterSpecs = [NumCounters]counterSpec{
	CounterCPU: {field: "cpu_usage_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return opt(s.CpuUsageUsec)
	}},
	CounterThrottledUsec: {field: "cpu_throttling.throttled_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return throttling(s, func(t *sandboxstatsv1.CpuThrottling) *uint64 { return t.ThrottledUsec })
	}},
	CounterPressureCPUSome: {field: "pressure.cpu.some_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetCpu(), false)
	}},
	CounterPressureCPUFull: {field: "pressure.cpu.full_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetCpu(), true)
	}},
	CounterPressureMemSome: {field: "pressure.memory.some_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetMemory(), false)
	}},
	CounterPressureMemFull: {field: "pressure.memory.full_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetMemory(), true)
	}},
	CounterPressureIOSome: {field: "pressure.io.some_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetIo(), false)
	}},
	CounterPressureIOFull: {field: "pressure.io.full_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return stall(s.GetPressure().GetIo(), true)
	}},
	CounterPeriods: {field: "cpu_throttling.periods", bound: boundPeriods, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return throttling(s, func(t *sandboxstatsv1.CpuThrottling) *uint64 { return t.Periods })
	}},
	CounterThrottledPeriods: {field: "cpu_throttling.throttled_periods", bound: boundPeriods, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return throttling(s, func(t *sandboxstatsv1.CpuThrottling) *uint64 { return t.ThrottledPeriods })
	}},
	CounterOOMKills: {field: "memory_signals.oom_kills", bound: boundCount, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		if m := s.GetMemorySignals(); m != nil {
			return opt(m.OomKills)
		}
		return 0, false
	}},
	CounterNetRxBytes:   net("rx_bytes", (*sandboxstatsv1.InterfaceCounters).GetRxBytes),
	CounterNetRxPackets: net("rx_packets", (*sandboxstatsv1.InterfaceCounters).GetRxPackets),
	CounterNetRxErrors:  net("rx_errors", (*sandboxstatsv1.InterfaceCounters).GetRxErrors),
	CounterNetRxDropped: net("rx_dropped", (*sandboxstatsv1.InterfaceCounters).GetRxDropped),
	CounterNetTxBytes:   net("tx_bytes", (*sandboxstatsv1.InterfaceCounters).GetTxBytes),
	CounterNetTxPackets: net("tx_packets", (*sandboxstatsv1.InterfaceCounters).GetTxPackets),
	CounterNetTxErrors:  net("tx_errors", (*sandboxstatsv1.InterfaceCounters).GetTxErrors),
	CounterNetTxDropped: net("tx_dropped", (*sandboxstatsv1.InterfaceCounters).GetTxDropped),
	CounterIOReadBytes:  blockIO("read_bytes", (*sandboxstatsv1.BlockIo).GetReadBytes),
	CounterIOWriteBytes: blockIO("write_bytes", (*sandboxstatsv1.BlockIo).GetWriteBytes),
	CounterIOReadOps:    blockIO("read_ios", (*sandboxstatsv1.BlockIo).GetReadIos),
	CounterIOWriteOps:   blockIO("write_ios", (*sandboxstatsv1.BlockIo).GetWriteIos),
	CounterSandboxOwnCPU: {field: "sandbox_own_cpu_usec", bound: boundCPUTime, get: func(s *sandboxstatsv1.WorkloadStatsSample) (uint64, bool) {
		return opt(s.SandboxOwnCpuUsec)
	}},
}

// String returns the counter's field as the sample's absent list names it
// ("cpu_usage_usec", "memory_signals.oom_kills", "network.total.rx_bytes").
func (c Counter) String() string {
	if c < 0 || c >= NumCounters {
		return "unknown"
	}
	return counterSpecs[c].field
}

// IsNetwork reports whether c is a network counter (per interface with
// AccountantConfig.PerInterface).
func (c Counter) IsNetwork() bool { return counterSpecs[c].iface != nil }

// CounterID names one account of an activation: a counter and, for a
// network counter accounted per interface, the interface.
type CounterID struct {
	Counter   Counter
	Interface string
}

// MaxInterfaces is the most interfaces of one sample accounted apart
// (AccountantConfig.PerInterface: api.InterfacesApart); the others are not
// accounted. MaxInterfaceName bounds a name.
const (
	MaxInterfaces    = api.MaxInterfacesApart
	MaxInterfaceName = api.MaxInterfaceName
)

type reading struct {
	id CounterID
	v  uint64
}

// readings returns the counters s carries, in Counter order; a counter
// absent from s is not there (absent is not zero). With perInterface the
// network counters are read per interface (loopback never), else from the
// total.
func readings(s *sandboxstatsv1.WorkloadStatsSample, perInterface bool) []reading {
	if s == nil {
		return nil
	}
	out := make([]reading, 0, NumCounters)
	for c := range NumCounters {
		spec := counterSpecs[c]
		if perInterface && spec.iface != nil {
			for _, ifc := range api.InterfacesApart(s.GetNetwork().GetInterfaces()) {
				out = append(out, reading{CounterID{c, ifc.GetName()}, spec.iface(ifc)})
			}
			continue
		}
		if v, ok := spec.get(s); ok {
			out = append(out, reading{CounterID{Counter: c}, v})
		}
	}
	return out
}

// valueOf returns counter id's value in s.
func valueOf(s *sandboxstatsv1.WorkloadStatsSample, id CounterID) (uint64, bool) {
	if s == nil {
		return 0, false
	}
	spec := counterSpecs[id.Counter]
	if id.Interface == "" || spec.iface == nil {
		return spec.get(s)
	}
	for _, ifc := range s.GetNetwork().GetInterfaces() {
		if ifc.GetName() == id.Interface {
			return spec.iface(ifc), true
		}
	}
	return 0, false
}

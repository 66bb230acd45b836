package source

// The signals and traffic parts of a Reading (see
// proto/sandboxstats/v1/signals.proto for each field's file, unit, layer and
// kind). A nil part is absent; a source that leaves a part or a field nil
// says why in Reading.Absent.

// Limit is a limit in force: Unlimited, or Value in the unit of the field
// holding it.
type Limit struct {
	Unlimited bool
	Value     uint64
}

// MemorySignals: the memory limit in force and what hitting it did.
type MemorySignals struct {
	LimitBytes    *Limit  // gauge
	HighBytes     *Limit  // gauge (v2 only)
	OOMKills      *uint64 // counter
	OOMGroupKills *uint64 // counter
	OOMEvents     *uint64 // counter
	MaxEvents     *uint64 // counter
	UnderOOM      *bool   // gauge (v1 only)
}

// CPUThrottling: the CFS quota in force and how often it bit.
type CPUThrottling struct {
	Periods          *uint64 // counter
	ThrottledPeriods *uint64 // counter
	ThrottledUsec    *uint64 // counter
	QuotaUsec        *Limit  // gauge, usec per period
	PeriodUsec       *uint64 // gauge
}

// PressureStall is one resource's PSI totals (counters, usec).
type PressureStall struct {
	SomeUsec *uint64
	FullUsec *uint64
}

// Pressure is the cgroup's PSI per resource; a nil resource is absent.
type Pressure struct {
	CPU, Memory, IO *PressureStall
}

// Pids is the number of tasks and their limit.
type Pids struct {
	Current uint64 // gauge
	Limit   *Limit // gauge
}

// InterfaceCounters are one interface's counters (or their sum).
type InterfaceCounters struct {
	Name                                    string
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

// Add adds o's counters to c (saturating), keeping c's name.
func (c *InterfaceCounters) Add(o InterfaceCounters) {
	for _, p := range []struct {
		dst *uint64
		v   uint64
	}{
		{&c.RxBytes, o.RxBytes}, {&c.RxPackets, o.RxPackets}, {&c.RxErrors, o.RxErrors}, {&c.RxDropped, o.RxDropped},
		{&c.TxBytes, o.TxBytes}, {&c.TxPackets, o.TxPackets}, {&c.TxErrors, o.TxErrors}, {&c.TxDropped, o.TxDropped},
	} {
		*p.dst = AddSat(*p.dst, p.v)
	}
}

// NetworkLayer says which side of the sandbox's network counters see.
type NetworkLayer int

const (
	NetworkLayerUnspecified NetworkLayer = iota
	// NetworkLayerHostNamespace: the host kernel's counters of the sentry's
	// network namespace.
	NetworkLayerHostNamespace
	// NetworkLayerGuest: the guest's own counters.
	NetworkLayerGuest
)

// Network is the sandbox's traffic. Total is nil when LoopbackOnly.
type Network struct {
	Layer        NetworkLayer
	Origin       string
	Total        *InterfaceCounters
	Interfaces   []InterfaceCounters
	Loopback     *InterfaceCounters
	LoopbackOnly bool
}

// DeviceIO is one block device's counters.
type DeviceIO struct {
	Major, Minor                             uint32
	ReadBytes, WriteBytes, ReadIOs, WriteIOs uint64
}

// BlockIO is the cgroup's block IO summed over Devices (counters).
type BlockIO struct {
	ReadBytes, WriteBytes, ReadIOs, WriteIOs uint64
	Devices                                  []DeviceIO
	Origin                                   string
}

// AddSat is a+b saturating at the largest uint64.
func AddSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// Loopback is the name of the loopback interface, never part of a total.
const Loopback = "lo"

// NewNetwork builds the Network part from one namespace's (or guest's)
// interfaces: loopback apart and never in the total; a namespace with only
// loopback has no network (LoopbackOnly, Total nil), not a zero one.
func NewNetwork(layer NetworkLayer, origin string, ifaces []InterfaceCounters) *Network {
	n := &Network{Layer: layer, Origin: origin}
	total := InterfaceCounters{Name: "total"}
	for _, c := range ifaces {
		if c.Name == Loopback {
			lo := c
			n.Loopback = &lo
			continue
		}
		n.Interfaces = append(n.Interfaces, c)
		total.Add(c)
	}
	if len(n.Interfaces) == 0 {
		n.LoopbackOnly = true
	} else {
		n.Total = &total
	}
	return n
}

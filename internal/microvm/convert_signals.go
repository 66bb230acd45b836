package microvm

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// throttledTimeFixed is taken as the first agent release whose
// throttling_data.throttled_time is real on a cgroup v2 guest. Before the
// fix (kata issue 13851, PR 13852) the agent looked up cpu.stat's
// throttled_time, which v2 does not have (it has throttled_usec), and sent 0.
// The PR was merged after the 4.2.0 version bump (PR 13833) and the issue
// says the bug "remains in 4.2.0"; no later release could be checked, so
// the release after 4.2.0 is assumed to carry it.
var throttledTimeFixed = agentVersion{Known: true, Major: 4, Minor: 3, Patch: 0}

// containerSignals is one container's signals in the API's units.
type containerSignals struct {
	MemoryLimit *source.Limit // nil: LimitWhy says why
	LimitWhy    string
	Throttling  *containerThrottling // nil: the reply has no throttling_data
	Pids        *source.Pids         // nil: the reply has no pids_stats
	// Network is network_stats by interface name, sorted; empty when the
	// agent sent none (the Rust agent never does) or too many (NetworkWhy).
	Network    []source.InterfaceCounters
	NetworkWhy string
	BlockIO    blockIOResult
}

// Caps on what one reading carries from the guest: the guest chooses how
// many interfaces and devices it names, and every one of them is in the
// answer.
const (
	maxInterfaces     = 64
	maxInterfaceBytes = 64 // IFNAMSIZ is 16
	maxDevices        = 64
)

// containerThrottling is throttling_data with the time in microseconds.
type containerThrottling struct {
	Periods, ThrottledPeriods uint64
	ThrottledUsec             uint64 // valid when ThrottledKnown
	ThrottledKnown            bool
	ThrottledWhy              string // why ThrottledKnown is false
}

// blockIOResult is what one reply's blkio_stats offered.
type blockIOResult struct {
	IO     *source.BlockIO // nil: no entries (Why empty) or malformed (Why set)
	Why    string
	Layout string // "v1" (blkio files) or "v2" (io.stat)
}

// convertSignals converts what a reply says besides memory and CPU usage.
func convertSignals(r *katagrpc.StatsContainerResponse, g guestCgroup, v agentVersion) containerSignals {
	cg := r.GetCgroupStats()
	var s containerSignals
	s.MemoryLimit, s.LimitWhy = memoryLimit(cg.GetMemoryStats().GetUsage().GetLimit())
	if td := cg.GetCpuStats().GetThrottlingData(); td != nil {
		s.Throttling = throttling(td, g, v)
	}
	if p := cg.GetPidsStats(); p != nil {
		b := &struct {
			pids  source.Pids
			limit source.Limit
		}{pids: source.Pids{Current: p.GetCurrent()}, limit: source.Limit{Unlimited: true}}
		if l := p.GetLimit(); l > 0 { // the agent encodes pids.max "max" as 0
			b.limit = source.Limit{Value: l}
		}
		b.pids.Limit = &b.limit
		s.Pids = &b.pids
	}
	s.Network, s.NetworkWhy = interfaces(r.GetNetworkStats())
	s.BlockIO = blockIO(cg.GetBlkioStats())
	return s
}

// memoryLimit reads memory_stats.usage.limit: above 2^62 is unlimited (v2
// sends u64::MAX for "max", v1 2^63 rounded to pages).
func memoryLimit(l uint64) (*source.Limit, string) {
	switch {
	case l > unlimitedAbove:
		return &source.Limit{Unlimited: true}, ""
	case l == 0:
		// cgroups-rs reads a v1 memory.limit_in_bytes it cannot read as 0;
		// a real limit of 0 would leave the container no memory at all.
		return nil, "the agent sent memory limit 0, what it sends when it could not read the limit file"
	default:
		return &source.Limit{Value: l}, ""
	}
}

// throttling converts throttling_data; throttled_time is ns on the wire.
func throttling(td *katagrpc.ThrottlingData, g guestCgroup, v agentVersion) *containerThrottling {
	t := &containerThrottling{Periods: td.GetPeriods(), ThrottledPeriods: td.GetThrottledPeriods()}
	switch {
	case g == guestV1, v.Known && !v.less(throttledTimeFixed):
		// v1 cpu.stat throttled_time is ns on every agent; fixed agents
		// turn v2's throttled_usec into ns.
		t.ThrottledUsec, t.ThrottledKnown = td.GetThrottledTime()/1000, true
	case g == guestV2 && v.noThrottledTime != "":
		t.ThrottledWhy = v.noThrottledTime // made once per connection
	case g == guestV2:
		t.ThrottledWhy = v.whyNoThrottledTime()
	default:
		t.ThrottledWhy = "the guest's cgroup version cannot be told from the reply; agent " + v.String() + ", unless fixed, " + throttledTimeBug
	}
	return t
}

// throttledTimeBug is what an agent before throttledTimeFixed does on a
// cgroup v2 guest.
const throttledTimeBug = "reads cpu.stat throttled_time, which a cgroup v2 guest lacks, so sends 0 (kata issue 13851; taken as fixed in 4.3.0)"

// whyNoThrottledTime is why a cgroup v2 guest's throttled time from agent
// v (not known to be fixed) is not read.
func (v agentVersion) whyNoThrottledTime() string {
	if v.Known {
		return "agent " + v.String() + " " + throttledTimeBug
	}
	return "agent version " + v.String() + " is not a release number; an agent before the fix " + throttledTimeBug
}

// interfaces turns network_stats into counters by name (cut and cleaned:
// the guest names them). Nameless entries are dropped (nothing to key them
// by); a name listed twice keeps the larger value of each counter. More than
// maxInterfaces names is not read at all (a partial list would make a false
// total), with why.
func interfaces(ns []*katagrpc.NetworkStats) ([]source.InterfaceCounters, string) {
	if len(ns) > 4*maxInterfaces {
		return nil, fmt.Sprintf("network_stats lists %d entries, more than %d interfaces: not read", len(ns), maxInterfaces)
	}
	var out []source.InterfaceCounters
	for _, n := range ns {
		if n.GetName() == "" {
			continue
		}
		out = mergeInterface(out, source.InterfaceCounters{
			Name:    foreign.Bound(n.GetName(), maxInterfaceBytes),
			RxBytes: n.GetRxBytes(), RxPackets: n.GetRxPackets(), RxErrors: n.GetRxErrors(), RxDropped: n.GetRxDropped(),
			TxBytes: n.GetTxBytes(), TxPackets: n.GetTxPackets(), TxErrors: n.GetTxErrors(), TxDropped: n.GetTxDropped(),
		})
		if len(out) > maxInterfaces {
			return nil, fmt.Sprintf("network_stats names more than %d interfaces: not read", maxInterfaces)
		}
	}
	return out, ""
}

// mergeInterface adds c to the name-sorted list, or, when the name is
// there, raises each counter to c's where c's is larger. The interfaces of
// one guest are shared by all its containers, so two containers report the
// same counters (read microseconds apart): taking the larger of each keeps
// it a counter, never a sum of copies.
func mergeInterface(list []source.InterfaceCounters, c source.InterfaceCounters) []source.InterfaceCounters {
	i, found := slices.BinarySearchFunc(list, c.Name, func(e source.InterfaceCounters, name string) int { return strings.Compare(e.Name, name) })
	if !found {
		return slices.Insert(list, i, c)
	}
	e := &list[i]
	for _, p := range []struct{ dst, v *uint64 }{
		{&e.RxBytes, &c.RxBytes}, {&e.RxPackets, &c.RxPackets}, {&e.RxErrors, &c.RxErrors}, {&e.RxDropped, &c.RxDropped},
		{&e.TxBytes, &c.TxBytes}, {&e.TxPackets, &c.TxPackets}, {&e.TxErrors, &c.TxErrors}, {&e.TxDropped, &c.TxDropped},
	} {
		*p.dst = max(*p.dst, *p.v)
	}
	return list
}

// blockIO sums blkio_stats per device. A v2 guest sends io.stat as
// io_service_bytes_recursive only, ops read/write (bytes), rios/wios
// (count), dbytes/dios (discards, not reported); a v1 guest sends bytes in
// io_service_bytes_recursive and counts in io_serviced_recursive, ops
// read/write/sync/async/total in either case ("Read" from the kernel and
// the old Go agent, "read" from the Rust agent).
func blockIO(b *katagrpc.BlkioStats) blockIOResult {
	bytes, ios := b.GetIoServiceBytesRecursive(), b.GetIoServicedRecursive()
	if len(bytes) == 0 && len(ios) == 0 {
		return blockIOResult{}
	}
	if n := len(bytes) + len(ios); n > 16*maxDevices {
		return blockIOResult{Layout: "v1", Why: fmt.Sprintf("blkio_stats has %d entries, more than %d devices can make: not read", n, maxDevices)}
	}
	res := blockIOResult{Layout: "v1"}
	for _, e := range bytes {
		switch strings.ToLower(e.GetOp()) {
		case "rios", "wios", "dbytes", "dios":
			res.Layout = "v2"
		}
	}
	var devs []source.DeviceIO
	for _, l := range []struct {
		name    string
		entries []*katagrpc.BlkioStatsEntry
	}{{"io_service_bytes_recursive", bytes}, {"io_serviced_recursive", ios}} {
		for _, e := range l.entries {
			if e.GetMajor() > math.MaxUint32 || e.GetMinor() > math.MaxUint32 {
				return blockIOResult{Layout: res.Layout,
					Why: fmt.Sprintf("blkio_stats %s names device %d:%d, out of range", l.name, e.GetMajor(), e.GetMinor())}
			}
			d := deviceEntry(&devs, uint32(e.GetMajor()), uint32(e.GetMinor()))
			if len(devs) > maxDevices {
				return blockIOResult{Layout: res.Layout, Why: fmt.Sprintf("blkio_stats names more than %d devices: not read", maxDevices)}
			}
			if f := blkioField(d, l.name, strings.ToLower(e.GetOp()), res.Layout); f != nil {
				*f = source.AddSat(*f, e.GetValue())
			}
		}
	}
	res.IO = &source.BlockIO{}
	for _, d := range devs {
		addDevice(res.IO, d)
	}
	return res
}

// blkioField is the counter of d an entry of list with (lower-case) op
// adds to; nil for ops without an API field (sync, async, total,
// discards).
func blkioField(d *source.DeviceIO, list, op, layout string) *uint64 {
	bytes := list == "io_service_bytes_recursive"
	v1Counts := !bytes && layout == "v1" // a v2 guest counts in rios/wios
	switch {
	case bytes && op == "read":
		return &d.ReadBytes
	case bytes && op == "write":
		return &d.WriteBytes
	case layout == "v2" && op == "rios", v1Counts && op == "read":
		return &d.ReadIOs
	case layout == "v2" && op == "wios", v1Counts && op == "write":
		return &d.WriteIOs
	}
	return nil
}

// deviceEntry finds or inserts the device in the list sorted by number.
func deviceEntry(devs *[]source.DeviceIO, major, minor uint32) *source.DeviceIO {
	key := func(d source.DeviceIO) uint64 { return uint64(d.Major)<<32 | uint64(d.Minor) }
	want := source.DeviceIO{Major: major, Minor: minor}
	i, found := slices.BinarySearchFunc(*devs, want, func(a, b source.DeviceIO) int { return cmp.Compare(key(a), key(b)) })
	if !found {
		*devs = slices.Insert(*devs, i, want)
	}
	return &(*devs)[i]
}

// addDevice adds d's counters to b, per device and in total.
func addDevice(b *source.BlockIO, d source.DeviceIO) {
	e := deviceEntry(&b.Devices, d.Major, d.Minor)
	e.ReadBytes, e.WriteBytes = source.AddSat(e.ReadBytes, d.ReadBytes), source.AddSat(e.WriteBytes, d.WriteBytes)
	e.ReadIOs, e.WriteIOs = source.AddSat(e.ReadIOs, d.ReadIOs), source.AddSat(e.WriteIOs, d.WriteIOs)
	b.ReadBytes, b.WriteBytes = source.AddSat(b.ReadBytes, d.ReadBytes), source.AddSat(b.WriteBytes, d.WriteBytes)
	b.ReadIOs, b.WriteIOs = source.AddSat(b.ReadIOs, d.ReadIOs), source.AddSat(b.WriteIOs, d.WriteIOs)
}

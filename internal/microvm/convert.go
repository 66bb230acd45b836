package microvm

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// guestCgroup is the cgroup version of the guest, as the payload shows it.
type guestCgroup int

const (
	guestUnknown guestCgroup = iota
	guestV1
	guestV2
)

func (g guestCgroup) String() string {
	switch g {
	case guestV1:
		return "v1"
	case guestV2:
		return "v2"
	default:
		return "unknown"
	}
}

// unlimitedAbove: a memory limit above 2^62 means "no limit" (v2 sends
// u64::MAX for "max", v1 about 2^63 rounded to the page size), the
// containerd CRI and kubelet convention.
const unlimitedAbove = 1 << 62

// containerStats is one container's reply in the API's units.
type containerStats struct {
	Guest             guestCgroup
	MemoryBytes       uint64           // usage.usage: v2 memory.current, v1 memory.usage_in_bytes
	WorkingSetBytes   uint64           // usage minus inactive file, floored at 0
	PeakBytes         uint64           // max(usage.max_usage, usage); valid when PeakOffered
	PeakOffered       bool             // false when the guest kernel has no memory.peak (< 5.19)
	CPUUsec           uint64           // valid when CPUKnown
	CPUUserUsec       uint64           // usage_in_usermode; valid when CPUKnown
	CPUSystemUsec     uint64           // usage_in_kernelmode; valid when CPUKnown
	CPUKnown          bool             // false when the CPU unit cannot be told (agent version unknown)
	CPUFromMicros     bool             // the agent sent microseconds (< 3.9.0 on a v2 guest)
	CPUUnknownBecause string           // why CPUKnown is false
	Signals           containerSignals // limit, throttling, pids, network, blkio (convert_signals.go)
}

// detectGuest tells the guest's cgroup version from a reply: only v1 has
// total_* keys in memory.stat, per-cpu usage, use_hierarchy or cache; only
// v2 has "anon" and "file".
func detectGuest(m *katagrpc.MemoryStats, cpu *katagrpc.CpuUsage) guestCgroup {
	for k := range m.GetStats() {
		if strings.HasPrefix(k, "total_") {
			return guestV1
		}
	}
	if len(cpu.GetPercpuUsage()) > 0 || m.GetUseHierarchy() || m.GetCache() > 0 {
		return guestV1
	}
	stats := m.GetStats()
	if _, ok := stats["anon"]; ok {
		return guestV2
	}
	if _, ok := stats["file"]; ok {
		return guestV2
	}
	return guestUnknown
}

// convertContainer turns one StatsContainer reply into the API's units. An
// error wraps source.ErrMalformed and names the container and the missing
// part.
func convertContainer(id string, r *katagrpc.StatsContainerResponse, v agentVersion) (containerStats, error) {
	cg := r.GetCgroupStats()
	cpu := cg.GetCpuStats().GetCpuUsage()
	mem := cg.GetMemoryStats()
	switch {
	case cg == nil:
		return containerStats{}, fmt.Errorf("%w: StatsContainer %q: reply has no cgroup_stats", source.ErrMalformed, id)
	case cpu == nil:
		return containerStats{}, fmt.Errorf("%w: StatsContainer %q: reply has no cgroup_stats.cpu_stats.cpu_usage", source.ErrMalformed, id)
	case mem.GetUsage() == nil:
		return containerStats{}, fmt.Errorf("%w: StatsContainer %q: reply has no cgroup_stats.memory_stats.usage", source.ErrMalformed, id)
	}
	var c containerStats
	c.Guest = detectGuest(mem, cpu)

	usage := mem.GetUsage()
	c.MemoryBytes = usage.GetUsage()
	inactiveKey := "inactive_file"
	if c.Guest == guestV1 {
		// v1's inactive_file is this cgroup only; the hierarchical one is
		// what usage_in_bytes counts.
		inactiveKey = "total_inactive_file"
	}
	c.WorkingSetBytes = c.MemoryBytes
	if inactive, ok := mem.GetStats()[inactiveKey]; ok {
		c.WorkingSetBytes = subFloor(c.MemoryBytes, inactive)
	}
	if usage.GetMaxUsage() > 0 {
		c.PeakOffered = true
		c.PeakBytes = max(usage.GetMaxUsage(), c.MemoryBytes)
	}

	// User and system keep their own names: usage_in_usermode is user,
	// usage_in_kernelmode is system. (Kata's Go shim swaps them in its
	// cgroup v2 conversion, setCPUStatsV2, since 3.1.0.)
	total, user, system := cpu.GetTotalUsage(), cpu.GetUsageInUsermode(), cpu.GetUsageInKernelmode()
	switch {
	case c.Guest == guestV1:
		// cpuacct.usage and cpuacct.stat (ticks scaled) are nanoseconds on
		// every agent.
		c.CPUUsec, c.CPUUserUsec, c.CPUSystemUsec, c.CPUKnown = total/1000, user/1000, system/1000, true
	case v.Known && !v.less(cpuNanosFixed):
		c.CPUUsec, c.CPUUserUsec, c.CPUSystemUsec, c.CPUKnown = total/1000, user/1000, system/1000, true
	case v.Known && c.Guest == guestV2:
		// Agents before 3.9.0 copy cpu.stat usage_usec, user_usec and
		// system_usec without the x1000.
		c.CPUUsec, c.CPUUserUsec, c.CPUSystemUsec, c.CPUKnown, c.CPUFromMicros = total, user, system, true, true
	case v.Known:
		c.CPUUnknownBecause = fmt.Sprintf("agent %s is older than 3.9.0 and the guest's cgroup version cannot be told from the reply, so the CPU unit (ns or us) is unknown", v)
	default:
		c.CPUUnknownBecause = fmt.Sprintf("agent version %s is not a release number, so the CPU unit of this cgroup v2 guest (us before agent 3.9.0, ns after) is unverified", v)
	}
	c.Signals = convertSignals(r, c.Guest, v)
	return c, nil
}

// own is the container's figures on their own (Reading.Containers): the
// guest cgroup is the container's, so memory is its own.
func (s containerStats) own(id string) source.Container {
	// The figures in one block: every sample has them.
	v := &[6]uint64{s.MemoryBytes, s.WorkingSetBytes, s.CPUUsec, s.CPUUserUsec, s.CPUSystemUsec}
	c := source.Container{
		ID:                    id,
		MemoryCurrentBytes:    &v[0],
		MemoryWorkingSetBytes: &v[1],
		MemoryIsOwn:           true,
	}
	if s.CPUKnown {
		c.CPUUsageUsec, c.CPUUserUsec, c.CPUSystemUsec = &v[2], &v[3], &v[4]
	} else {
		for _, f := range []string{"cpu_usage_usec", "cpu_user_usec", "cpu_system_usec"} {
			c.Absent = append(c.Absent, source.Absent{Field: f, Reason: s.CPUUnknownBecause})
		}
	}
	if p := s.Signals.Pids; p != nil {
		v[5] = p.Current
		c.PidsCurrent = &v[5]
	} else {
		c.Absent = append(c.Absent, source.Absent{Field: "pids_current", Reason: "no pids_stats in the reply (no pids controller in the guest cgroup)"})
	}
	return c
}

// subFloor is a-b floored at 0.
func subFloor(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}

// containerResult is what a sweep got for one container.
type containerResult struct {
	ID    string
	Stats containerStats
	Err   error  // nil when Stats is valid
	Why   string // the UnreadContainers reason when Err is set
}

// aggregate sums the containers that could be read into one Reading. It
// fails only when no container could be read; the error then wraps
// ErrMalformed if any reply was malformed, ErrTimeout if every call ran out
// of time, and ErrNotMeasurable otherwise.
func aggregate(addr string, v agentVersion, results []containerResult) (source.Reading, error) {
	r := source.Reading{Kind: source.KindGuestAgent}
	var (
		read                    int
		guestsSeen              [3]guestCgroup // guestUnknown, guestV1, guestV2 at most
		guests                  = guestsSeen[:0]
		peakMissing, cpuMissing []string
		cpuWhy                  string
		fromMicros              bool
		signals                 signalSums
		// The sums of the peaks and of CPU, in one block.
		sums = new([2]uint64)
	)
	r.Containers = make([]source.Container, 0, len(results))
	for _, c := range results {
		if c.Err != nil {
			r.UnreadContainers = append(r.UnreadContainers, source.ContainerError{ID: c.ID, Reason: c.Why})
			continue
		}
		read++
		s := c.Stats
		if !slices.Contains(guests, s.Guest) {
			guests = append(guests, s.Guest)
		}
		r.MemoryCurrentBytes = source.AddSat(r.MemoryCurrentBytes, s.MemoryBytes)
		r.MemoryWorkingSetBytes = source.AddSat(r.MemoryWorkingSetBytes, s.WorkingSetBytes)
		if s.PeakOffered {
			sums[0] = source.AddSat(sums[0], s.PeakBytes)
			r.MemoryPeakBytes = &sums[0]
		} else {
			peakMissing = append(peakMissing, c.ID)
		}
		if s.CPUKnown {
			sums[1] = source.AddSat(sums[1], s.CPUUsec)
			r.CPUUsageUsec = &sums[1]
		} else {
			cpuMissing = append(cpuMissing, c.ID)
			cpuWhy = s.CPUUnknownBecause
		}
		fromMicros = fromMicros || s.CPUFromMicros
		signals.add(c.ID, s.Signals)
		r.Containers = append(r.Containers, s.own(c.ID))
	}
	if read == 0 {
		return source.Reading{}, allFailed(addr, results)
	}

	var partial string
	switch {
	case len(r.UnreadContainers) > 0:
		// A sum missing a container is neither the workload's counter (it
		// would fall, then jump back) nor an upper bound on its peak.
		r.CPUUsageUsec, r.MemoryPeakBytes = nil, nil
		partial = fmt.Sprintf("partial sample: %d of %d containers unread; a partial sum is not comparable with a full one", len(r.UnreadContainers), len(results))
		r.Absent = append(r.Absent,
			source.Absent{Field: "memory_peak_bytes", Reason: partial},
			source.Absent{Field: "cpu_usage_usec", Reason: partial})
	default:
		if len(peakMissing) > 0 {
			r.MemoryPeakBytes = nil
			r.Absent = append(r.Absent, source.Absent{Field: "memory_peak_bytes",
				Reason: fmt.Sprintf("the guest reports no memory peak for container(s) %s (cgroup v2 memory.peak needs guest Linux 5.19)", strings.Join(peakMissing, ", "))})
		}
		if len(cpuMissing) > 0 {
			r.CPUUsageUsec = nil
			r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec",
				Reason: fmt.Sprintf("container(s) %s: %s", strings.Join(cpuMissing, ", "), cpuWhy)})
		}
	}

	var d strings.Builder
	d.Grow(160 + len(addr) + len(v.String()))
	d.WriteString("guest agent ")
	d.WriteString(addr)
	d.WriteString(", agent_version ")
	d.WriteString(v.String())
	d.WriteString("; guest cgroup ")
	for i, g := range guests {
		if i > 0 {
			d.WriteByte('+')
		}
		d.WriteString(g.String())
	}
	d.WriteString("; ")
	d.WriteString(strconv.Itoa(read))
	d.WriteString(" container(s) summed")
	if fromMicros {
		d.WriteString("; CPU corrected from us (agent < 3.9.0 on a cgroup v2 guest)")
	}
	if r.MemoryPeakBytes != nil && read > 1 {
		d.WriteString("; memory peak is the sum of per-container peaks, an upper bound on the workload's peak")
	}
	d.WriteString(signals.limitDetail())
	r.Detail = d.String()
	signals.fill(&r, addr, partial)
	return r, nil
}

// allFailed is the error of a sweep in which no container could be read.
func allFailed(addr string, results []containerResult) error {
	sentinel := source.ErrTimeout
	var parts []string
	for _, c := range results {
		parts = append(parts, fmt.Sprintf("%s: %s", c.ID, c.Why))
	}
	for _, c := range results {
		switch {
		case errors.Is(c.Err, source.ErrMalformed):
			sentinel = source.ErrMalformed
		case !errors.Is(c.Err, source.ErrTimeout) && sentinel == source.ErrTimeout:
			sentinel = source.ErrNotMeasurable
		}
		if sentinel == source.ErrMalformed {
			break
		}
	}
	if len(results) == 0 {
		sentinel = source.ErrNotMeasurable
	}
	unread := make([]source.ContainerError, 0, len(results))
	answered := false
	for _, c := range results {
		unread = append(unread, source.ContainerError{ID: c.ID, Reason: c.Why})
		answered = answered || errors.Is(c.Err, source.ErrAnswered)
	}
	err := fmt.Errorf("microvm: %w: agent %s: no container could be read: %s", sentinel, addr, strings.Join(parts, "; "))
	if answered {
		// The agent answered, if only with errors: it is not silent.
		err = fmt.Errorf("microvm: %w: %w: agent %s: no container could be read: %s", sentinel, source.ErrAnswered, addr, strings.Join(parts, "; "))
	}
	return &source.UnreadError{Containers: unread, Err: err}
}

package microvm

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Reasons for what StatsContainer never carries, whatever the guest: in
// every micro-VM sample, so each is a line, and a KnownAbsent code of the
// API (internal/api holds the texts; docs/microvm.md has the rest).
const (
	whyNoHigh      = api.WhyAgentNoHigh
	whyNoOOM       = api.WhyAgentNoOOM
	whyNoEvents    = api.WhyAgentNoEvents
	whyNoOOMCtl    = api.WhyAgentNoOOMControl
	whyNoQuota     = api.WhyAgentNoQuota
	whyNoPressure  = api.WhyAgentNoPressure
	whyNoNetwork   = api.WhyAgentNoNetwork
	whyNoBlkioRows = api.WhyAgentNoBlockIO
)

// signalSums adds up the signals of the containers read (see
// docs/microvm.md for each rule).
type signalSums struct {
	// memory_signals.limit_bytes
	limitSum       uint64
	limitUnlimited bool
	limitMissing   []string
	limitWhy       string
	// cpu_throttling
	periods, throttledPer uint64
	throttledUsec         uint64
	noThrottling          []string
	throttledMissing      []string
	throttledWhy          string
	// pids
	pidsCurrent   uint64
	pidsLimitSum  uint64
	pidsUnlimited bool
	noPids        []string
	// network, block_io
	network []source.InterfaceCounters // by name, once each
	netBad  []string                   // containers whose network_stats was not read
	netWhy  string
	blk     source.BlockIO
	blkRows bool     // some container sent entries
	blkBad  []string // containers whose entries are malformed
	blkWhy  string
	layouts []string // guest blkio layouts seen, "v1" / "v2"
}

// add adds one container's signals.
func (s *signalSums) add(id string, c containerSignals) {
	switch l := c.MemoryLimit; {
	case l == nil:
		s.limitMissing, s.limitWhy = append(s.limitMissing, id), c.LimitWhy
	case l.Unlimited:
		s.limitUnlimited = true
	default:
		s.limitSum = source.AddSat(s.limitSum, l.Value)
	}
	if t := c.Throttling; t == nil {
		s.noThrottling = append(s.noThrottling, id)
	} else {
		s.periods = source.AddSat(s.periods, t.Periods)
		s.throttledPer = source.AddSat(s.throttledPer, t.ThrottledPeriods)
		if t.ThrottledKnown {
			s.throttledUsec = source.AddSat(s.throttledUsec, t.ThrottledUsec)
		} else {
			s.throttledMissing, s.throttledWhy = append(s.throttledMissing, id), t.ThrottledWhy
		}
	}
	if p := c.Pids; p == nil {
		s.noPids = append(s.noPids, id)
	} else {
		s.pidsCurrent = source.AddSat(s.pidsCurrent, p.Current)
		if p.Limit.Unlimited {
			s.pidsUnlimited = true
		} else {
			s.pidsLimitSum = source.AddSat(s.pidsLimitSum, p.Limit.Value)
		}
	}
	// One guest, one network: every container reports the same
	// interfaces, so each is taken once by name, never summed.
	if c.NetworkWhy != "" {
		s.netBad, s.netWhy = append(s.netBad, id), c.NetworkWhy
	}
	for _, n := range c.Network {
		s.network = mergeInterface(s.network, n)
	}
	if len(s.network) > maxInterfaces {
		s.network = nil
		s.netBad, s.netWhy = append(s.netBad, id), fmt.Sprintf("the containers name more than %d interfaces together: not read", maxInterfaces)
	}
	switch b := c.BlockIO; {
	case b.Why != "":
		s.blkBad, s.blkWhy = append(s.blkBad, id), b.Why
	case b.IO != nil:
		s.blkRows = true
		for _, d := range b.IO.Devices {
			addDevice(&s.blk, d)
		}
		if len(s.blk.Devices) > maxDevices {
			s.blkBad, s.blkWhy = append(s.blkBad, id), fmt.Sprintf("the containers name more than %d devices together: not read", maxDevices)
		}
	}
	if b := c.BlockIO; b.Layout != "" && !slices.Contains(s.layouts, b.Layout) {
		s.layouts = append(s.layouts, b.Layout)
	}
}

// fill sets the signals and traffic parts of r and their absent reasons.
// partial is the reason of a partial sample ("" for a full one): its
// counters (throttling, network, block IO) are dropped, its gauges (limit,
// pids) are the sums of the containers read, like memory_current_bytes.
func (s *signalSums) fill(r *source.Reading, addr, partial string) {
	// At most 13 entries below: one allocation rather than a slice regrown
	// four times on every sample.
	r.Absent = slices.Grow(r.Absent, 13)
	absent := func(field, why string) { r.Absent = append(r.Absent, source.Absent{Field: field, Reason: why}) }
	ids := func(list []string) string { return strings.Join(list, ", ") }

	// What every sample has, in one block.
	b := new(struct {
		mem        source.MemorySignals
		memLimit   source.Limit
		throttling source.CPUThrottling
		counters   [3]uint64 // periods, throttled periods, throttled time
		pids       source.Pids
		pidsLimit  source.Limit
	})
	switch {
	case s.limitUnlimited:
		b.memLimit.Unlimited = true
		b.mem.LimitBytes, r.Memory = &b.memLimit, &b.mem
	case len(s.limitMissing) > 0:
		absent("memory_signals.limit_bytes", fmt.Sprintf("container(s) %s: %s", ids(s.limitMissing), s.limitWhy))
	default:
		b.memLimit.Value = s.limitSum
		b.mem.LimitBytes, r.Memory = &b.memLimit, &b.mem
	}
	absent("memory_signals.high_bytes", whyNoHigh)
	absent("memory_signals.oom_kills", whyNoOOM)
	absent("memory_signals.oom_group_kills", whyNoEvents)
	absent("memory_signals.oom_events", whyNoEvents)
	absent("memory_signals.max_events", whyNoEvents)
	absent("memory_signals.under_oom", whyNoOOMCtl)

	switch {
	case partial != "":
		absent("cpu_throttling", partial)
	case len(s.noThrottling) > 0:
		absent("cpu_throttling", fmt.Sprintf("no throttling_data in the reply of container(s) %s (no cpu controller in the guest cgroup)", ids(s.noThrottling)))
	default:
		b.counters = [3]uint64{s.periods, s.throttledPer, s.throttledUsec}
		t := &b.throttling
		t.Periods, t.ThrottledPeriods = &b.counters[0], &b.counters[1]
		if len(s.throttledMissing) == 0 {
			t.ThrottledUsec = &b.counters[2]
		} else {
			absent("cpu_throttling.throttled_usec", "container(s) "+ids(s.throttledMissing)+": "+s.throttledWhy)
		}
		absent("cpu_throttling.quota_usec", whyNoQuota)
		absent("cpu_throttling.period_usec", whyNoQuota)
		r.Throttling = t
	}

	absent("pressure", whyNoPressure)

	if len(s.noPids) > 0 {
		absent("pids", fmt.Sprintf("no pids_stats in the reply of container(s) %s (no pids controller in the guest cgroup)", ids(s.noPids)))
	} else {
		b.pidsLimit = source.Limit{Value: s.pidsLimitSum}
		if s.pidsUnlimited {
			b.pidsLimit = source.Limit{Unlimited: true}
		}
		b.pids = source.Pids{Current: s.pidsCurrent, Limit: &b.pidsLimit}
		r.Pids = &b.pids
	}

	switch {
	case partial != "":
		absent("network", partial)
	case len(s.netBad) > 0:
		absent("network", fmt.Sprintf("container(s) %s: %s", ids(s.netBad), s.netWhy))
	case len(s.network) == 0:
		absent("network", whyNoNetwork)
	default:
		r.Network = source.NewNetwork(source.NetworkLayerGuest, fmt.Sprintf("guest agent %s: StatsContainer network_stats, each interface once", addr), s.network)
	}

	switch {
	case partial != "":
		absent("block_io", partial)
	case len(s.blkBad) > 0:
		absent("block_io", fmt.Sprintf("container(s) %s: %s", ids(s.blkBad), s.blkWhy))
	case !s.blkRows:
		absent("block_io", whyNoBlkioRows)
	default:
		b := s.blk
		b.Origin = fmt.Sprintf("guest agent %s: StatsContainer blkio_stats (guest cgroup %s layout), summed over containers", addr, strings.Join(s.layouts, "+"))
		r.BlockIO = &b
	}
}

// limitDetail is the memory limit as source_detail names it.
func (s *signalSums) limitDetail() string {
	switch {
	case s.limitUnlimited:
		return "; memory limit: unlimited"
	case len(s.limitMissing) > 0:
		return ""
	default:
		return fmt.Sprintf("; memory limit: %d bytes", s.limitSum)
	}
}

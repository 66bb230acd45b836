package server

// This file bounds what one answer carries (issue 16): a sample, with its
// host view and its epoch baseline, is at most maxSampleBytes on the wire,
// StatsHost's view at most maxHostViewBytes; over the cap, parts are cut in
// a fixed order, each only while the answer is still over, and each cut is
// named in the answer's `absent` list with the sizes. It runs where domain
// types have just become wire types, once per answer.

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The bounds of every answer.
const (
	// maxResponseBytes is what every response of statsd stays under.
	maxResponseBytes = 64 << 10
	// pageBytes is what a page of ended activations, and a
	// StatsActiveWorkloads answer with its samples and ended records, is
	// filled up to (the rest is margin for the page token).
	pageBytes = 56 << 10
	// maxSampleBytes bounds one sample with its host view and baseline: one
	// sample and one ended record (a sample and at most about 3 KiB beside
	// it) fit in a page together.
	maxSampleBytes = 24 << 10
	// maxHostViewBytes bounds StatsHost's view, alone in its answer.
	maxHostViewBytes = 48 << 10
	// The first cut, "text", cuts every absent and unread-container reason
	// (the containers' absent reasons too) to maxCutReason bytes, and
	// source_detail and the origins to maxCutDetail (each then ends
	// "...(+N bytes)").
	maxCutReason = 128
	maxCutDetail = 256
)

// cutPrefix begins the reason of every cut.
const cutPrefix = "cut: "

// cutParts are what a cut reaches: a sample and its baseline's first read
// (nil when it has none), or only a host view (StatsHost).
type cutParts struct {
	samples []*sandboxstatsv1.WorkloadStatsSample
	host    **sandboxstatsv1.HostStats
}

// cut is one step of the fixed order in which an answer over its cap sheds
// parts.
type cut struct {
	field string // as a reader finds it: "network.interfaces"
	what  string // what was done: "the per-interface list dropped"
	unit  string // what drop counts: "interfaces"
	kept  string // what stays, if worth saying
	// drop removes the part wherever p has it and returns how many items
	// it removed (0: p has none of it). It never modifies a slice it did
	// not make: wire messages may share slices with domain values (a cached
	// host view).
	drop func(p cutParts) int
}

// sampleCuts is the order in which a sample sheds parts: text first (it
// carries no number), then what the node agent accounts least (per-interface
// counters beyond the ones it accounts apart, then those, then per-device
// ones), then the host view from its finest detail up, then the
// per-container list.
var sampleCuts = []cut{
	{field: "text", what: fmt.Sprintf("long text cut (absent and unread-container reasons to %d bytes, source_detail and the origins to %d)", maxCutReason, maxCutDetail),
		unit: "strings", drop: cutText},
	{field: "network.interfaces", what: fmt.Sprintf("the per-interface list cut to the %d a consumer accounts apart (api.InterfacesApart; the sample's and epoch_baseline.first_read's)", api.MaxInterfacesApart), unit: "interfaces",
		kept: "network.total, network.loopback and those interfaces kept", drop: trimInterfaces},
	{field: "network.interfaces", what: "the per-interface list dropped (the sample's and epoch_baseline.first_read's)", unit: "interfaces",
		kept: "network.total and network.loopback kept", drop: dropInterfaces},
	{field: "block_io.devices", what: "the per-device list dropped (the sample's and epoch_baseline.first_read's)", unit: "devices",
		kept: "the block_io sums kept", drop: dropDevices},
	{field: "host.kvm.qmp.counters", what: "the per-vCPU QMP counters dropped", unit: "counters", kept: "the VM-wide ones kept", drop: dropQMPPerVCPU},
	{field: "host.kvm.qmp.counters", what: "every QMP counter dropped", unit: "counters", drop: dropQMP},
	{field: "host.vmm_threads.threads", what: "the per-thread list dropped", unit: "threads", kept: "vcpu_totals and other_totals kept", drop: dropThreads},
	{field: "host.runner_kernel.per_cpu", what: "the per-CPU list dropped", unit: "CPUs", kept: "the total kept", drop: dropPerCPU},
	{field: "host", what: "the host view dropped", unit: "view", kept: "host.observed_at_unix_nano kept", drop: dropHost},
	// Last: the containers cannot be read any other way (the host view can,
	// with StatsHost), and the sample's figures are their sums. The exited
	// ones fold first (their sums kept), then the list goes.
	{field: "containers", what: "the exited containers folded into one entry, id " + identity.FoldedExitedID + " (the sample's and epoch_baseline.first_read's)", unit: "containers",
		kept: "their counters' sums kept", drop: foldExited},
	{field: "containers", what: "the per-container list dropped (the sample's and epoch_baseline.first_read's)", unit: "containers",
		kept: "the sample's figures (the containers' sums) kept", drop: dropContainers},
}

// hostCuts is the order in which StatsHost's view sheds parts: the host
// cuts of a sample, in the same order.
var hostCuts = sampleCuts[4:9]

// capSample keeps s, with its host view and baseline, within
// maxSampleBytes by sampleCuts, naming each cut in s.Absent. nil is left
// alone.
func capSample(s *sandboxstatsv1.WorkloadStatsSample) {
	capSampleTo(s, maxSampleBytes, "the sample")
}

// capSampleTo keeps s within limit bytes by sampleCuts, naming each cut (and
// name, what the limit is) in s.Absent. nil is left alone.
func capSampleTo(s *sandboxstatsv1.WorkloadStatsSample, limit int, name string) {
	if s == nil || proto.Size(s) <= limit {
		return // within its cap: no cut (applyCuts would make none)
	}
	if s.EpochBaseline != nil {
		// Shared with other answers (baselinecache.go): cut a copy.
		s.EpochBaseline = proto.CloneOf(s.EpochBaseline)
	}
	p := cutParts{samples: []*sandboxstatsv1.WorkloadStatsSample{s}, host: &s.Host}
	if fr := s.GetEpochBaseline().GetFirstRead(); fr != nil {
		p.samples = append(p.samples, fr)
	}
	s.Absent = applyCuts(func() int { return proto.Size(s) }, limit, name, sampleCuts, p, s.Absent, sampleAbsentField)
}

// capHostView keeps r's host view within maxHostViewBytes by hostCuts,
// naming each cut in r.Absent.
func capHostView(r *sandboxstatsv1.StatsHostResponse) {
	r.Absent = applyCuts(func() int { return proto.Size(r.GetHost()) }, maxHostViewBytes, "the host view", hostCuts, cutParts{host: &r.Host}, r.Absent, hostAbsentField)
}

// The field numbers the cuts are named in: WorkloadStatsSample.absent and
// StatsHostResponse.absent.
const (
	sampleAbsentField = 18
	hostAbsentField   = 5
)

// applyCuts applies cuts to p, in order, while what sizeOf measures (with
// the entries naming the cuts made so far, which go in a repeated field
// numbered field) is over limit bytes, and returns absent with an entry per
// cut made.
func applyCuts(sizeOf func() int, limit int, name string, cuts []cut, p cutParts, absent []*sandboxstatsv1.AbsentValue, field protowire.Number) []*sandboxstatsv1.AbsentValue {
	size := sizeOf()
	var made []*sandboxstatsv1.AbsentValue
	over := func() bool { return size+absentBytes(made, field) > limit }
	for _, c := range cuts {
		if !over() {
			break
		}
		n := c.drop(p)
		if n == 0 {
			continue
		}
		after := sizeOf()
		reason := fmt.Sprintf("%s%s was %d bytes, over its %d-byte cap: %s (%d %s, %d bytes)",
			cutPrefix, name, size+absentBytes(made, field), limit, c.what, n, c.unit, size-after)
		if c.kept != "" {
			reason += "; " + c.kept
		}
		made = append(made, &sandboxstatsv1.AbsentValue{Field: c.field, Reason: reason})
		size = after
	}
	return append(absent, made...)
}

// absentBytes is what the entries add to a message in its repeated field
// numbered field.
func absentBytes(as []*sandboxstatsv1.AbsentValue, field protowire.Number) int {
	n := 0
	for _, a := range as {
		n += protowire.SizeTag(field) + protowire.SizeBytes(proto.Size(a))
	}
	return n
}

// trimInterfaces keeps, of each sample's interfaces, the ones a consumer
// accounts apart (api.InterfacesApart: a slice of its own, the old one may
// be shared), so a sample trimmed to them charges the same.
func trimInterfaces(p cutParts) int {
	n := 0
	for _, s := range p.samples {
		net := s.GetNetwork()
		kept := api.InterfacesApart(net.GetInterfaces())
		if d := len(net.GetInterfaces()) - len(kept); d > 0 {
			n += d
			net.Interfaces = kept
		}
	}
	return n
}

func dropInterfaces(p cutParts) int {
	n := 0
	for _, s := range p.samples {
		if net := s.GetNetwork(); len(net.GetInterfaces()) > 0 {
			n += len(net.Interfaces)
			net.Interfaces = nil
		}
	}
	return n
}

// foldExited replaces each sample's exited containers, when more than one,
// by one entry (identity.FoldedExitedID) whose counters are their sums (a
// counter none of them has stays absent): identity's shape, the fixed name
// and how many it holds in its gauges' absent reason. It returns how many
// entries went.
func foldExited(p cutParts) int {
	n := 0
	for _, s := range p.samples {
		var (
			live   []*sandboxstatsv1.ContainerStats
			exited []*sandboxstatsv1.ContainerStats
		)
		for _, c := range s.GetContainers() {
			if c.GetExited() {
				exited = append(exited, c)
			} else {
				live = append(live, c)
			}
		}
		if len(exited) < 2 {
			continue
		}
		f := &sandboxstatsv1.ContainerStats{Id: identity.FoldedExitedID, Exited: true}
		count := 0
		for _, c := range exited {
			count += foldedCount(c)
			f.CpuUsageUsec = source.AddCounter(f.CpuUsageUsec, c.CpuUsageUsec)
			f.CpuUserUsec = source.AddCounter(f.CpuUserUsec, c.CpuUserUsec)
			f.CpuSystemUsec = source.AddCounter(f.CpuSystemUsec, c.CpuSystemUsec)
		}
		f.Name = identity.FoldedExitedID
		for _, field := range []struct {
			name string
			v    *uint64
		}{{"cpu_usage_usec", f.CpuUsageUsec}, {"cpu_user_usec", f.CpuUserUsec}, {"cpu_system_usec", f.CpuSystemUsec}} {
			if field.v == nil {
				f.Absent = append(f.Absent, &sandboxstatsv1.AbsentValue{Field: field.name, Reason: "none of the folded containers had it"})
			}
		}
		for _, g := range []string{"memory_current_bytes", "memory_working_set_bytes", "pids_current"} {
			f.Absent = append(f.Absent, &sandboxstatsv1.AbsentValue{Field: g, Reason: identity.FoldedReason(count)})
		}
		s.Containers = append(live, f)
		n += len(exited) - 1
	}
	return n
}

// foldedCount is how many containers c, an exited entry, holds: a folded
// entry's count (its gauges' reason), 1 for any other.
func foldedCount(c *sandboxstatsv1.ContainerStats) int {
	if c.GetId() != identity.FoldedExitedID {
		return 1
	}
	for _, x := range c.GetAbsent() {
		if n, ok := identity.FoldedCount(x.GetReason()); ok {
			return n
		}
	}
	return 1
}

func dropContainers(p cutParts) int {
	n := 0
	for _, s := range p.samples {
		n += len(s.GetContainers())
		s.Containers = nil
	}
	return n
}

func dropDevices(p cutParts) int {
	n := 0
	for _, s := range p.samples {
		if b := s.GetBlockIo(); len(b.GetDevices()) > 0 {
			n += len(b.Devices)
			b.Devices = nil
		}
	}
	return n
}

// qmpOf returns the QMP view of p's host view, or nil.
func qmpOf(p cutParts) *sandboxstatsv1.KvmSourceView {
	if p.host == nil {
		return nil
	}
	return (*p.host).GetKvm().GetQmp()
}

// dropQMPPerVCPU keeps only the VM-wide ("vm") QMP counters.
func dropQMPPerVCPU(p cutParts) int {
	q := qmpOf(p)
	if q == nil {
		return 0
	}
	var vm []*sandboxstatsv1.KvmCounter
	for _, c := range q.GetCounters() {
		if c.GetScope() == "vm" {
			vm = append(vm, c)
		}
	}
	n := len(q.GetCounters()) - len(vm)
	if n > 0 {
		q.Counters = vm
	}
	return n
}

func dropQMP(p cutParts) int {
	q := qmpOf(p)
	n := len(q.GetCounters())
	if n > 0 {
		q.Counters = nil
	}
	return n
}

func dropThreads(p cutParts) int {
	if p.host == nil {
		return 0
	}
	v := (*p.host).GetVmmThreads()
	n := len(v.GetThreads())
	if n > 0 {
		v.Threads = nil
	}
	return n
}

func dropPerCPU(p cutParts) int {
	if p.host == nil {
		return 0
	}
	v := (*p.host).GetRunnerKernel()
	n := len(v.GetPerCpu())
	if n > 0 {
		v.PerCpu = nil
	}
	return n
}

// dropHost replaces the host view by one that only says it was cut (its
// observed_at kept).
func dropHost(p cutParts) int {
	if p.host == nil || *p.host == nil {
		return 0
	}
	h := *p.host
	*p.host = &sandboxstatsv1.HostStats{ObservedAtUnixNano: h.GetObservedAtUnixNano(),
		UnavailableReason: "cut: the host view was dropped to keep the answer bounded (see absent, field \"host\")"}
	return 1
}

// cutText cuts the long text of the samples: their absent and
// unread-container reasons, source_detail and the network and block IO
// origins (the cuts' own entries are added after it).
func cutText(p cutParts) int {
	n := 0
	bound := func(s *string, max int) {
		if b := foreign.Bound(*s, max); len(b) < len(*s) {
			*s, n = b, n+1
		}
	}
	for _, s := range p.samples {
		bound(&s.SourceDetail, maxCutDetail)
		if s.GetNetwork() != nil {
			bound(&s.Network.Origin, maxCutDetail)
		}
		if s.GetBlockIo() != nil {
			bound(&s.BlockIo.Origin, maxCutDetail)
		}
		for _, a := range s.GetAbsent() {
			bound(&a.Reason, maxCutReason)
		}
		for _, u := range s.GetUnreadContainers() {
			bound(&u.Reason, maxCutReason)
		}
		for _, c := range s.GetContainers() {
			for _, a := range c.GetAbsent() {
				bound(&a.Reason, maxCutReason)
			}
		}
	}
	return n
}

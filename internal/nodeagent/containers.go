package nodeagent

// This file exports a sample's containers (WorkloadStatsSample.containers):
// each container's CPU as a counter charged by the workload's rules, and
// its memory, working set and pids as gauges where the source measures
// them (absent stays absent).
//
// The CPU is charged by a second rate.Accountant (metrics.cacct) fed one
// synthetic sample per container: the container's own activation key (a
// hash of the actor's uid and the container's id, with the workload's
// source and epoch), its CPU counter and its baseline (the container's
// value in the guest agent's first read; 0 for a container that appeared
// after it; the epoch start for the cgroup source). So each container has
// the workload's head, body, reset and tail rules and its persistence
// (--state-dir), and a container that appears mid-activation is a first
// sight of its own key (charged from its start, when it fits the time)
// while one that disappears keeps what it was charged (its account ages
// out with the horizon). CPU statsd moves between entries (a restart merged
// into the exited entry of its name, the folded entry) is fed so that it
// is not charged twice (containers_moved.go). The ended record's final carries the containers:
// each is ended like an activation, its tail charged once.

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// DefaultMaxContainers bounds the containers of one workload's sample
// with a container label of their own; the rest are exported as
// otherContainer (counted by metricContainersFolded).
const DefaultMaxContainers = 16

// otherContainer is the container label of the containers past the cap.
const otherContainer = "(other)"

const (
	metricContainerCPU        = "sandboxstats_container_cpu_seconds_total"
	metricContainerMemory     = "sandboxstats_container_memory_current_bytes"
	metricContainerWorkingSet = "sandboxstats_container_memory_working_set_bytes"
	metricContainerPids       = "sandboxstats_container_pids"
	metricContainersFolded    = "sandboxstats_agent_containers_folded_total"
)

// containerKey is one per-container series: its workload's labels and the
// container label.
type containerKey struct {
	labels    labelSet
	container string
	// cadvisor: a series under cAdvisor's names (CAdvisorCompat), labels
	// holding only the actor's namespace and name (namespace, pod).
	cadvisor bool
}

// containerValues are one per-container series' figures: the gauges of
// the last sweep (summed over its workloads, a gauge absent when any of
// them lacks it) and the CPU charged (µs) since start.
type containerValues struct {
	sampled                   bool // in the last sweep
	running                   bool // a container of it not exited in the last sweep: the gauges are set
	current, wset, pids       uint64
	noCurrent, noWset, noPids bool
	cpu                       uint64
	start                     time.Time
	lastSeen                  time.Time
}

// containerLabel is a container's label value: its name, its id when it
// has no name, cut as labels are.
func containerLabel(c *sandboxstatsv1.ContainerStats) string {
	if c.GetName() != "" {
		return cut(c.GetName())
	}
	return cut(c.GetId())
}

// containerUID is the synthetic actor uid of a container's account: the
// actor's and the container's ids hashed (a uid of 253 bytes and an id of
// as many must not be cut into another container's key).
func containerUID(actorUID, containerID string) string {
	h := sha256.New()
	h.Write([]byte(actorUID))
	h.Write([]byte{0})
	h.Write([]byte(containerID))
	return "container:" + hex.EncodeToString(h.Sum(nil))
}

// containerSample is the synthetic sample of container c of s: its CPU
// counter as fed (containers_moved.go) with its own baseline.
func containerSample(s *sandboxstatsv1.WorkloadStatsSample, c *sandboxstatsv1.ContainerStats, fed uint64) *sandboxstatsv1.WorkloadStatsSample {
	cs := &sandboxstatsv1.WorkloadStatsSample{
		ActorUid: containerUID(s.GetActorUid(), c.GetId()), Source: s.GetSource(), SandboxClass: s.GetSandboxClass(),
		EpochUnixNano: s.GetEpochUnixNano(), ObservedAtUnixNano: s.GetObservedAtUnixNano(),
		CpuUsageUsec: &fed,
	}
	b := s.GetEpochBaseline()
	if b == nil {
		return cs
	}
	cb := &sandboxstatsv1.EpochBaseline{Kind: b.GetKind(), ObservedAtUnixNano: b.GetObservedAtUnixNano()}
	if b.GetKind() == sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ && b.GetFirstRead() != nil {
		// A container not in the first read appeared after it: its
		// counter started at 0.
		base := uint64(0)
		for _, fc := range b.GetFirstRead().GetContainers() {
			if fc.GetId() == c.GetId() {
				if fc.CpuUsageUsec == nil {
					return withBaseline(cs, nil) // no baseline for it: delta mode
				}
				base = fc.GetCpuUsageUsec()
			}
		}
		cb.FirstRead = &sandboxstatsv1.WorkloadStatsSample{CpuUsageUsec: &base}
	}
	return withBaseline(cs, cb)
}

func withBaseline(s *sandboxstatsv1.WorkloadStatsSample, b *sandboxstatsv1.EpochBaseline) *sandboxstatsv1.WorkloadStatsSample {
	s.EpochBaseline = b
	return s
}

// containersOf returns s's containers with their labels, at most max of
// them under their own; the rest (their count is folded) are labelled
// otherContainer.
func containersOf(s *sandboxstatsv1.WorkloadStatsSample, max int) (labels []string, folded int) {
	cs := s.GetContainers()
	labels = make([]string, len(cs))
	own := map[string]bool{}
	for i, c := range cs {
		l := containerLabel(c)
		if !own[l] && len(own) >= max {
			labels[i] = otherContainer
			folded++
			continue
		}
		own[l] = true
		labels[i] = l
	}
	return labels, folded
}

// addContainers records the containers of s (labels l), sampled at now:
// their gauges, their CPU charged.
func (m *metrics) addContainers(l labelSet, s *sandboxstatsv1.WorkloadStatsSample, now time.Time) {
	if len(s.GetContainers()) == 0 {
		return
	}
	names, folded := containersOf(s, m.maxContainers())
	m.containersFolded.Add(float64(folded))
	if m.otel != nil {
		m.otel.containerFolded(folded)
	}
	var charged uint64
	fed, has := m.fedValues(rate.KeyOf(s), s.GetContainers(), now)
	for i, c := range s.GetContainers() {
		charged = 0
		if has[i] {
			charges, _ := m.cacct.Sample(containerSample(s, c, fed[i]), now)
			charged = charges.CPU()
		}
		for _, k := range m.containerKeys(l, s.GetActorNamespace(), s.GetActorName(), names[i]) {
			cv := m.containerSeries(k, now)
			cv.sample(c)
			cv.cpu = addSat(cv.cpu, charged)
		}
	}
}

// sample adds c's gauges to cv's of this sweep. An exited container
// (ContainerStats.exited) has none: it adds nothing, so that a series
// holding only exited containers has no gauges, and one whose name an
// exited container shares with its running successor (a restart: a new
// id, the same name) has the successor's.
func (cv *containerValues) sample(c *sandboxstatsv1.ContainerStats) {
	if !cv.sampled {
		cv.sampled, cv.running = true, false
		cv.current, cv.wset, cv.pids = 0, 0, 0
		cv.noCurrent, cv.noWset, cv.noPids = false, false, false
	}
	if c.GetExited() {
		return
	}
	cv.running = true
	if c.MemoryCurrentBytes == nil || !c.GetMemoryIsOwn() {
		cv.noCurrent = true
	} else {
		cv.current = addSat(cv.current, c.GetMemoryCurrentBytes())
	}
	if c.MemoryWorkingSetBytes == nil || !c.GetMemoryIsOwn() {
		cv.noWset = true
	} else {
		cv.wset = addSat(cv.wset, c.GetMemoryWorkingSetBytes())
	}
	if c.PidsCurrent == nil {
		cv.noPids = true
	} else {
		cv.pids = addSat(cv.pids, c.GetPidsCurrent())
	}
}

// containerKeys are the series a container (label name) of a workload
// (labels l, its actor's namespace and name) is exported in: its own, and
// with CAdvisorCompat cAdvisor's.
func (m *metrics) containerKeys(l labelSet, namespace, pod, name string) []containerKey {
	keys := []containerKey{{labels: l, container: name}}
	if m.cadvisor != nil {
		keys = append(keys, cadvisorKey(namespace, pod, name))
	}
	return keys
}

// endContainers charges the tails of the containers of e's final (labels
// l), once.
func (m *metrics) endContainers(l labelSet, e *sandboxstatsv1.EndedActivation, now time.Time) {
	final := e.GetFinal()
	if len(final.GetContainers()) == 0 {
		return
	}
	names, folded := containersOf(final, m.maxContainers())
	m.containersFolded.Add(float64(folded))
	if m.otel != nil {
		m.otel.containerFolded(folded)
	}
	k := rate.EndedKeyOf(e)
	fed, has := m.fedValues(k, final.GetContainers(), now)
	delete(m.ledgers, k)
	for i, c := range final.GetContainers() {
		if !has[i] {
			continue
		}
		cs := containerSample(final, c, fed[i])
		cs.Source, cs.EpochUnixNano = e.GetSource(), e.GetEpochUnixNano()
		ce := &sandboxstatsv1.EndedActivation{
			Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: cs.GetActorUid()},
			Source:   e.GetSource(), SandboxClass: e.GetSandboxClass(),
			EpochUnixNano: e.GetEpochUnixNano(), EndUnixNano: e.GetEndUnixNano(),
			BaselineDelayNanos: e.GetBaselineDelayNanos(), Final: cs,
		}
		if own, ok := rate.OwnCPU(cs); ok {
			ce.CpuUsec = &own
		}
		charges, _, first := m.cacct.End(ce, now)
		if !first {
			continue
		}
		id := e.GetIdentity()
		for _, k := range m.containerKeys(l, id.GetActorNamespace(), id.GetActorName(), names[i]) {
			cv := m.containerSeries(k, now)
			cv.cpu = addSat(cv.cpu, charges.CPU())
		}
	}
}

// containerSeries returns k's values, made at now the first time.
func (m *metrics) containerSeries(k containerKey, now time.Time) *containerValues {
	cv := m.containers[k]
	if cv == nil {
		cv = &containerValues{start: now}
		m.containers[k] = cv
	}
	cv.lastSeen = now
	return cv
}

func (m *metrics) maxContainers() int {
	if m.cfg.MaxContainers > 0 {
		return m.cfg.MaxContainers
	}
	return DefaultMaxContainers
}

// snapContainers copies the container series charged within the grace
// period into snap (the gauges only of those sampled this sweep), and
// forgets the others.
func (m *metrics) snapContainers(snap *snapshot, now time.Time) {
	for k, cv := range m.containers {
		if now.Sub(cv.lastSeen) > m.cfg.Grace {
			delete(m.containers, k)
			continue
		}
		c := *cv
		snap.containers[k] = &c
		cv.sampled = false
	}
}

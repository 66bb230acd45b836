package nodeagent

import (
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Apply makes results the latest sweep, seen at now (the agent's clock,
// for the grace period), which took took. Each daemon's ended activations
// are charged before its samples, so that an activation that ended and the
// one that followed it are accounted apart.
func (m *metrics) Apply(results []sweep.DaemonResult, now time.Time, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()

	snap := &snapshot{
		drift:   make(map[driftKey]int),
		series:  make(map[labelSet]*seriesValues),
		cpu:     make(map[labelSet]uint64),
		daemons: make(map[sweep.Status]int),
	}
	// Forget first, so an activation back after the grace period is seen
	// afresh.
	for _, k := range m.cpu.Prune(now) {
		m.logger.Debug("forgot activation after grace period", "actor_uid", k.ActorUID, "source", api.SourceName(k.Source), "epoch_unix_nano", k.EpochUnixNano)
	}
	seen := make(map[rate.ActivationKey]string) // activation -> socket, this sweep
	for _, r := range results {
		snap.daemons[r.Status]++
		if r.Status == sweep.StatusError {
			m.pollErrors.WithLabelValues(r.Code.String()).Inc()
		}
		for _, e := range r.Ended {
			m.addEnded(r.Socket, e, now)
		}
		for _, s := range r.Samples {
			key := rate.KeyOf(s)
			if other, dup := seen[key]; dup {
				m.logger.Warn("same workload reported by two daemons; keeping the first",
					"actor_uid", key.ActorUID, "socket", r.Socket, "first_socket", other)
				continue
			}
			seen[key] = r.Socket
			m.addSample(snap, s, now)
		}
		if r.DriftErr != nil {
			m.logger.Debug("drift findings not listed", "socket", r.Socket, "err", r.DriftErr)
		}
		m.addDrift(snap, r)
	}
	for l, t := range m.totals {
		if now.Sub(t.lastSeen) > m.cfg.Grace {
			delete(m.totals, l)
			continue
		}
		snap.cpu[l] = t.usec
	}
	m.snap.Store(snap)

	m.sweepDuration.Observe(took.Seconds())
	m.lastSweep.Set(took.Seconds())
	m.lastSweepTime.Set(float64(now.UnixNano()) / 1e9)
	m.sweeps.Inc()
}

func (m *metrics) addDrift(snap *snapshot, r sweep.DaemonResult) {
	for _, f := range r.DriftFindings {
		kind := api.DriftKindName(f.GetKind())
		matched := false
		for _, s := range r.Samples {
			if s.GetActorUid() == f.GetActorUid() {
				snap.drift[driftKey{kind: kind, labels: m.labelsOf(s)}]++
				matched = true
			}
		}
		if !matched {
			// No sample of its workload (not measurable yet, reads timing
			// out): only what the finding itself carries.
			var l labelSet
			if m.cfg.LabelActor {
				l.actorUID = f.GetActorUid()
			}
			snap.drift[driftKey{kind: kind, labels: l}]++
		}
	}
}

func (m *metrics) addSample(snap *snapshot, s *sandboxstatsv1.WorkloadStatsSample, now time.Time) {
	l := m.labelsOf(s)
	sv := snap.series[l]
	if sv == nil {
		sv = &seriesValues{}
		snap.series[l] = sv
	}
	sv.workloads++
	charges, ev := m.cpu.Sample(s, now)
	charged := charges.CPU()
	if !rate.Measured(s) {
		return
	}
	sv.current += s.GetMemoryCurrentBytes()
	sv.wset += s.GetMemoryWorkingSetBytes()
	if s.MemoryPeakBytes == nil {
		sv.peakIncomplete = true
	} else {
		sv.peak += s.GetMemoryPeakBytes()
	}
	m.charge(l, charged, now)
	if ev == rate.EventCounterReset || (ev == rate.EventFirst && charged > 0) {
		m.logger.Debug("cpu charged from the activation's start", "actor_uid", s.GetActorUid(), "event", string(ev),
			"epoch_unix_nano", s.GetEpochUnixNano(), "charged_usec", charged)
	}
}

func (m *metrics) charge(l labelSet, usec uint64, now time.Time) {
	t := m.totals[l]
	if t == nil {
		t = &cpuTotal{}
		m.totals[l] = t
	}
	t.usec += usec
	t.lastSeen = now
}

// addEnded charges an ended activation's tail once and, the first time,
// records it in the per-template distributions and the activation log.
func (m *metrics) addEnded(socket string, e *sandboxstatsv1.EndedActivation, now time.Time) {
	charges, how, first := m.cpu.End(e, now)
	charged := charges.CPU()
	if !first {
		return
	}
	id := e.GetIdentity()
	l := labelSet{
		class: api.ClassName(e.GetSandboxClass()), source: api.SourceName(e.GetSource()),
		templateNamespace: id.GetTemplateNamespace(), templateName: id.GetTemplateName(),
	}
	tl := l.values(false)
	if m.cfg.LabelActor {
		l.actorUID, l.actorName, l.actorNamespace = id.GetActorUid(), id.GetActorName(), id.GetActorNamespace()
	}
	if e.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED {
		m.charge(l, charged, now)
	}
	m.ended.WithLabelValues(append(tl, api.OutcomeName(e.GetOutcome()))...).Inc()
	m.finals.WithLabelValues(append(tl, api.ProvenanceName(e.GetFinalProvenance()))...).Inc()
	if e.CpuUsec != nil {
		m.actCPU.WithLabelValues(tl...).Observe(float64(e.GetCpuUsec()) / 1e6)
	}
	switch {
	case e.MemoryPeakBytes == nil:
		m.noPeak.WithLabelValues(append(tl, "absent")...).Inc()
	case e.GetMemoryPeakIsLowerBound():
		m.noPeak.WithLabelValues(append(tl, "lower-bound")...).Inc()
	default:
		m.actPeak.WithLabelValues(tl...).Observe(float64(e.GetMemoryPeakBytes()))
	}
	duration := time.Duration(e.GetEndUnixNano() - e.GetEpochUnixNano())
	m.actDuration.WithLabelValues(tl...).Observe(duration.Seconds())
	m.logger.Debug("activation ended", "actor_uid", id.GetActorUid(), "epoch_unix_nano", e.GetEpochUnixNano(),
		"outcome", api.OutcomeName(e.GetOutcome()), "charged_usec", charged, "charge", string(how), "socket", socket)
	if m.actLog != nil {
		if err := m.actLog.Encode(activationRecord(socket, e, charged, how)); err != nil {
			m.logger.Warn("activation log write failed", "err", err)
		}
	}
}

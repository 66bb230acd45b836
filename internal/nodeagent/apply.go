package nodeagent

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Apply makes results the latest sweep, seen at now (the agent's clock,
// for the grace period), which took took. Each daemon's ended activations
// are charged before its samples, so that an activation that ended and the
// one that followed it are accounted apart. The samples and records of an
// actor in conflict (see conflicting) are not believed.
func (m *metrics) Apply(results []sweep.DaemonResult, now time.Time, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()

	snap := &snapshot{
		drift:      make(map[driftKey]int),
		series:     make(map[labelSet]*seriesValues, len(m.snap.Load().series)),
		counters:   make(map[labelSet]*counterValues, len(m.totals)),
		daemons:    make(map[sweep.Status]int),
		containers: make(map[containerKey]*containerValues, len(m.containers)),
	}
	// Forget first, so an activation back after the grace period is seen
	// afresh.
	for _, k := range m.acct.Prune(now) {
		m.logger.Debug("forgot activation after grace period", "actor_uid", k.ActorUID, "source", api.SourceName(k.Source), "epoch_unix_nano", k.EpochUnixNano)
	}
	m.cacct.Prune(now)
	m.pruneLedgers(now)
	for k, o := range m.owners {
		if now.Sub(o.lastSeen) > m.cfg.EndedHorizon {
			delete(m.owners, k)
		}
	}
	m.pruneActivations(now)
	m.pruneEndedMarks(now)
	suspect := m.conflicting(results)
	for _, r := range results {
		snap.daemons[r.Status]++
		if r.Status == sweep.StatusError {
			m.pollErrors.WithLabelValues(codeLabel(r.Code)).Inc()
			if m.otel != nil {
				m.otel.pollErrors.Add(context.Background(), 1, metric.WithAttributes(attribute.String(attrGRPCCode, codeLabel(r.Code))))
			}
		}
		for _, part := range r.Capped {
			m.capped.WithLabelValues(part).Inc()
		}
		if r.PeerRefused {
			m.refused.WithLabelValues("peer").Inc()
		}
		m.watchEnded(r, now)
		for _, e := range r.Ended {
			if !suspect[rate.EndedKeyOf(e).ActorUID] {
				m.addEnded(r.Socket, e, now)
			}
		}
		var believed []*sandboxstatsv1.WorkloadStatsSample
		for _, s := range r.Samples {
			if !suspect[rate.KeyOf(s).ActorUID] {
				m.addSample(snap, r.Socket, s, now)
				believed = append(believed, s)
			}
		}
		if r.DriftErr != nil {
			m.logger.Debug("drift findings not listed", "socket", r.Socket, "err", r.DriftErr)
		}
		m.addDrift(snap, r.DriftFindings, believed)
	}
	for l, t := range m.totals {
		if now.Sub(t.lastSeen) > m.cfg.Grace {
			delete(m.totals, l)
			continue
		}
		snap.counters[l] = t.values.clone()
	}
	m.snapContainers(snap, now)
	if m.otel != nil {
		snap.activations = make(map[labelSet]*activationCounts, len(m.activations))
		for l, ac := range m.activations {
			snap.activations[l] = ac.clone()
		}
	}
	m.sweepDuration.Observe(took.Seconds())
	m.lastSweep.Set(took.Seconds())
	m.lastSweepTime.Set(float64(now.UnixNano()) / 1e9)
	m.sweeps.Inc()
	if m.otel != nil {
		m.otel.swept(took)
	}
	// Saved before it is served: a restart continues from counters at
	// least as high as any scrape saw (docs/statsagent.md, "Restarts").
	if m.state != nil {
		m.state.save(m.exportState(now))
	}
	// Last: a new snapshot is a new sweep for the Handler's gatherer
	// (sweepGatherer), which gathers each sweep's metrics once.
	m.snap.Store(snap)
}

// conflicting returns the actors (by their keys' uids, rate.KeyOf: a uid
// past the key's cut is checked as it is accounted) none of whose samples
// or records this sweep believes, and counts each once as a conflict: an actor sampled by
// more than one daemon (or twice by one), or an activation reported (sampled
// or ended) by another socket than the one it was sampled from. The agent
// cannot tell the real daemon from an impostor, so it believes neither:
// the first socket never wins. Nothing is lost by it: the activation's
// counters are charged at its next believed sample or record.
func (m *metrics) conflicting(results []sweep.DaemonResult) map[string]bool {
	samples := make(map[string]int, len(results))                 // actor -> its samples
	reporter := make(map[rate.ActivationKey]string, len(results)) // activation -> its owner's socket, or the first reporting it
	suspect := map[string]bool{}
	report := func(k rate.ActivationKey, socket string) {
		first, ok := reporter[k]
		if !ok {
			first = socket
			if o, known := m.owners[k]; known {
				first = o.socket
			}
			reporter[k] = first
		}
		if first != socket {
			suspect[k.ActorUID] = true
		}
	}
	for _, r := range results {
		for _, s := range r.Samples {
			k := rate.KeyOf(s)
			if samples[k.ActorUID]++; samples[k.ActorUID] > 1 {
				suspect[k.ActorUID] = true
			}
			report(k, r.Socket)
		}
		for _, e := range r.Ended {
			report(rate.EndedKeyOf(e), r.Socket)
		}
	}
	if len(suspect) == 0 {
		return suspect
	}
	sockets := make(map[string][]string, len(suspect)) // suspect actor -> the sockets of its samples
	for _, r := range results {
		for _, s := range r.Samples {
			if actor := rate.KeyOf(s).ActorUID; suspect[actor] {
				sockets[actor] = append(sockets[actor], r.Socket)
			}
		}
	}
	for actor := range suspect {
		m.conflicts.Inc()
		if m.otel != nil {
			m.otel.conflicts.Add(context.Background(), 1)
		}
		m.logger.Warn("one actor reported by more than one daemon: none of its samples or records believed",
			"actor_uid", cut(actor), "sockets", sockets[actor])
	}
	return suspect
}

func (m *metrics) addDrift(snap *snapshot, findings []*sandboxstatsv1.DriftFinding, samples []*sandboxstatsv1.WorkloadStatsSample) {
	for _, f := range findings {
		kind := driftKindLabel(f.GetKind())
		matched := false
		for _, s := range samples {
			if s.GetActorUid() == f.GetActorUid() {
				l := m.labelsOf(s)
				l.templateNamespace, l.templateName = m.templates.exported(l.templateNamespace, l.templateName)
				snap.drift[driftKey{kind: kind, labels: l}]++
				matched = true
			}
		}
		if !matched {
			// No sample of its workload (not measurable yet, reads timing
			// out): only what the finding itself carries.
			var l labelSet
			l.withPool = m.cfg.LabelWorkerPool
			if m.cfg.LabelActor {
				l.actorUID = cut(f.GetActorUid())
			}
			snap.drift[driftKey{kind: kind, labels: l}]++
		}
	}
}

// addSat is a+b saturating at the largest uint64 (a hostile daemon's sums
// must not wrap to small numbers).
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

func (m *metrics) addSample(snap *snapshot, socket string, s *sandboxstatsv1.WorkloadStatsSample, now time.Time) {
	l := m.labelsOf(s)
	m.fold(&l, now, false)
	sv := snap.series[l]
	if sv == nil {
		sv = &seriesValues{}
		snap.series[l] = sv
	}
	sv.workloads++
	if !knownSource(s.GetSource()) {
		return // not measured, or a layer this build does not know: counted, no numbers
	}
	charges, ev := m.acct.Sample(s, now)
	_, seen := m.owners[rate.KeyOf(s)]
	m.owners[rate.KeyOf(s)] = owner{socket: socket, lastSeen: now}
	if m.otel != nil && ev != rate.EventEnded {
		switch {
		case !seen:
			m.otel.sampleEvent(KindInitial, socket, s, now)
		case m.otel.periodic():
			m.otel.sampleEvent(KindPeriodic, socket, s, now)
		}
	}
	sv.current = addSat(sv.current, s.GetMemoryCurrentBytes())
	sv.wset = addSat(sv.wset, s.GetMemoryWorkingSetBytes())
	if s.MemoryPeakBytes == nil {
		sv.peakIncomplete = true
	} else {
		sv.peak = addSat(sv.peak, s.GetMemoryPeakBytes())
	}
	if lim := s.GetMemorySignals().GetLimitBytes(); lim == nil || lim.GetUnlimited() {
		sv.limitMissing = true
	} else {
		sv.limit = addSat(sv.limit, lim.GetValue())
	}
	if p := s.GetPids(); p == nil {
		sv.pidsMissing = true
	} else {
		sv.pids = addSat(sv.pids, p.GetCurrent())
	}
	m.charge(l, charges, now)
	m.chargeCAdvisorPod(s.GetActorNamespace(), s.GetActorName(), charges, now)
	m.addContainers(l, s, now)
	if charged := charges.CPU(); ev == rate.EventCounterReset || (ev == rate.EventFirst && charged > 0) {
		m.logger.Debug("cpu charged from the activation's start", "actor_uid", cut(s.GetActorUid()), "event", string(ev),
			"epoch_unix_nano", s.GetEpochUnixNano(), "charged_usec", charged)
	}
}

// charge adds charges to l's counters. CPU is there from the first charge
// on (0 when the sample had none); another counter once some sample or
// record carried it: absent is not zero. A charge that would make a total
// overflow is refused and counted (reason overflow).
func (m *metrics) charge(l labelSet, charges rate.Charges, now time.Time) {
	t := m.totals[l]
	if t == nil {
		t = &counterTotals{}
		t.values.has[rate.CounterCPU], t.values.start = true, now
		m.totals[l] = t
	}
	for _, c := range charges {
		if !t.values.add(c.ID, c.Value) {
			m.overflows.Add(1)
		}
	}
	t.lastSeen = now
}

// addEnded charges an ended activation's tail once and, the first time,
// records it in the per-template distributions and the activation log.
func (m *metrics) addEnded(socket string, e *sandboxstatsv1.EndedActivation, now time.Time) {
	charges, how, first := m.acct.End(e, now)
	if !first {
		return
	}
	charged := charges.CPU()
	id := e.GetIdentity()
	tmpl, l := m.endedLabels(e)
	m.fold(&tmpl, now, true)
	l.templateNamespace, l.templateName = tmpl.templateNamespace, tmpl.templateName
	tl := tmpl.values(false)
	if knownSource(e.GetSource()) {
		m.charge(l, charges, now)
		m.chargeCAdvisorPod(id.GetActorNamespace(), id.GetActorName(), charges, now)
		m.endContainers(l, e, now)
	}
	ac := m.endedSeries(tmpl, now)
	outcome, provenance := api.OutcomeName(e.GetOutcome()), api.ProvenanceName(e.GetFinalProvenance())
	m.ended.WithLabelValues(append(tl, outcome)...).Inc()
	ac.ended[outcome]++
	m.finals.WithLabelValues(append(tl, provenance)...).Inc()
	ac.finals[provenance]++
	if e.CpuUsec != nil {
		cpu := float64(e.GetCpuUsec()) / 1e6
		m.actCPU.WithLabelValues(tl...).Observe(cpu)
		ac.cpu.record(cpu, cpuBounds)
	}
	noPeak := ""
	switch {
	case e.MemoryPeakBytes == nil:
		noPeak = "absent"
	case e.GetMemoryPeakIsLowerBound():
		noPeak = "lower-bound"
	default:
		m.actPeak.WithLabelValues(tl...).Observe(float64(e.GetMemoryPeakBytes()))
		ac.peak.record(clampInt64(e.GetMemoryPeakBytes()), peakBounds)
	}
	if noPeak != "" {
		m.noPeak.WithLabelValues(append(tl, noPeak)...).Inc()
		ac.noPeak[noPeak]++
	}
	duration := time.Duration(e.GetEndUnixNano() - e.GetEpochUnixNano())
	m.actDuration.WithLabelValues(tl...).Observe(duration.Seconds())
	ac.duration.record(duration.Seconds(), durationBounds)
	m.logger.Debug("activation ended", "actor_uid", cut(id.GetActorUid()), "epoch_unix_nano", e.GetEpochUnixNano(),
		"outcome", api.OutcomeName(e.GetOutcome()), "charged_usec", charged, "charge", string(how), "socket", socket)
	if m.otel != nil {
		m.otel.finalEvent(socket, e, charged, how, now)
	}
	if m.actLog != nil {
		if err := m.actLog.Encode(activationRecord(socket, e, charged, how)); err != nil {
			m.logger.Warn("activation log write failed", "err", err)
		}
	}
}

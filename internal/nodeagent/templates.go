package nodeagent

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// A pod's author names its template (the sandboxstats.dev/template label),
// so the template labels are a tenant's to multiply: every series that
// carries them is per template. Two bounds keep them finite. At most
// metricsConfig.MaxTemplates templates have their own label values at a time; the others
// are folded into otherTemplate, their numbers summed whole there (as
// maxInterfacesPerSet folds interfaces). And a template leaves the export
// when nothing of it is left to report: its workload counters after
// metricsConfig.Grace without a sample (as before), its per-activation
// series after metricsConfig.EndedHorizon without an ended activation;
// then its slot is free for another.

// DefaultMaxTemplates is metricsConfig.MaxTemplates when zero.
const DefaultMaxTemplates = 64

// otherTemplate is the template namespace and name of what MaxTemplates
// folds.
const otherTemplate = otherInterface

// metricTemplatesFolded counts the folds.
const metricTemplatesFolded = "sandboxstats_agent_templates_folded_total"

// templateKey is one template: what a slot is held by.
type templateKey struct{ namespace, name string }

// templateUse is when a template's slot was last used: by a sample or a
// charge (its workload series), and by an ended activation (its
// per-activation series).
type templateUse struct{ seen, ended time.Time }

// templateSlots are the templates with label values of their own.
type templateSlots struct {
	max   int
	slots map[templateKey]*templateUse
}

// use returns the template labels that namespace and name are exported
// under at now: their own while they hold a slot (taking a free one the
// first time), otherTemplate when every slot is held by another. ended
// marks an ended activation's use. folded reports the fold.
func (ts *templateSlots) use(namespace, name string, now time.Time, ended bool) (ns, n string, folded bool) {
	k := templateKey{namespace, name}
	u := ts.slots[k]
	if u == nil {
		if len(ts.slots) >= ts.max {
			return otherTemplate, otherTemplate, true
		}
		u = &templateUse{}
		ts.slots[k] = u
	}
	u.seen = now
	if ended {
		u.ended = now
	}
	return namespace, name, false
}

// exported returns the template labels namespace and name are exported
// under now, as use does but taking no slot: what a sample already used
// this sweep (use) is exported under.
func (ts *templateSlots) exported(namespace, name string) (ns, n string) {
	if _, ok := ts.slots[templateKey{namespace, name}]; ok {
		return namespace, name
	}
	return otherTemplate, otherTemplate
}

// prune frees the slots of templates with nothing left to report at now:
// no workload series (grace) and no per-activation series (horizon).
func (ts *templateSlots) prune(now time.Time, grace, horizon time.Duration) {
	for k, u := range ts.slots {
		if now.Sub(u.seen) > grace && now.Sub(u.ended) > horizon {
			delete(ts.slots, k)
		}
	}
}

// fold exports l under its template's labels at now (see templateSlots.use)
// and counts a fold.
func (m *metrics) fold(l *labelSet, now time.Time, ended bool) {
	var folded bool
	l.templateNamespace, l.templateName, folded = m.templates.use(l.templateNamespace, l.templateName, now, ended)
	if !folded {
		return
	}
	m.folded.Inc()
	if m.otel != nil {
		m.otel.templatesFolded()
	}
}

// activationCounts are one template label set's ended activations as the
// OTel export reports them (the Prometheus counters and histograms keep
// their own): by the value of each counter's own attribute, and their
// distributions (Distributions); since start, the last of them at last.
type activationCounts struct {
	ended, finals, noPeak map[string]int64
	cpu, duration         dist[float64] // seconds
	peak                  dist[int64]   // bytes
	start, last           time.Time
}

func (ac *activationCounts) clone() *activationCounts {
	return &activationCounts{ended: maps.Clone(ac.ended), finals: maps.Clone(ac.finals), noPeak: maps.Clone(ac.noPeak),
		cpu: ac.cpu.clone(), duration: ac.duration.clone(), peak: ac.peak.clone(), start: ac.start, last: ac.last}
}

// endedSeries returns the per-activation counts of template label set l,
// made the first time, marked used at now.
func (m *metrics) endedSeries(l labelSet, now time.Time) *activationCounts {
	ac := m.activations[l]
	if ac == nil {
		ac = &activationCounts{ended: map[string]int64{}, finals: map[string]int64{}, noPeak: map[string]int64{}, start: now}
		m.activations[l] = ac
	}
	ac.last = now
	return ac
}

// pruneActivations removes the per-activation series of the template
// label sets none of whose activations ended within EndedHorizon of now:
// the agent has forgotten every activation counted in them (rate's
// Accountant remembers one as long), so no record can count in them again.
func (m *metrics) pruneActivations(now time.Time) {
	for l, ac := range m.activations {
		if now.Sub(ac.last) <= m.cfg.EndedHorizon {
			continue
		}
		delete(m.activations, l)
		match := prometheus.Labels{"sandbox_class": l.class, "source": l.source, "template_namespace": l.templateNamespace, "template_name": l.templateName}
		for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.ended, m.finals, m.noPeak, m.actCPU, m.actPeak, m.actDuration} {
			v.DeletePartialMatch(match)
		}
		m.logger.Debug("forgot a template's activation series after the ended horizon", "template_namespace", l.templateNamespace, "template_name", l.templateName)
	}
	m.templates.prune(now, m.cfg.Grace, m.cfg.EndedHorizon)
}

// labelActorWorkloads is the most workloads per node whose per-workload
// series (LabelActor) the OTel SDK's cardinality limit must hold apart.
const labelActorWorkloads = 1000

// OTelCardinalityLimit is the OTel SDK's cardinality limit (attribute sets
// per instrument; past it the SDK folds into one overflow point) that the
// agent's instruments never reach legitimately with maxTemplates (0:
// DefaultMaxTemplates): each template label set (maxTemplates templates
// and otherTemplate, each with any class and source) or each of
// labelActorWorkloads workloads (LabelActor), times the most values of an
// instrument's own attribute (an outcome, a provenance, a drift kind, a
// PSI resource, a direction).
func OTelCardinalityLimit(maxTemplates int) int {
	extras := max(len(sandboxstatsv1.ActivationOutcome_name), len(sandboxstatsv1.FinalProvenance_name),
		len(sandboxstatsv1.DriftKind_name), 3) + 1
	return workloadSets(maxTemplates) * extras
}

// workloadSets is the most workload label sets with maxTemplates (0:
// DefaultMaxTemplates): each template label set (maxTemplates templates
// and otherTemplate, each with any class and source), or each of
// labelActorWorkloads workloads (LabelActor).
func workloadSets(maxTemplates int) int {
	if maxTemplates <= 0 {
		maxTemplates = DefaultMaxTemplates
	}
	classes := len(sandboxstatsv1.SandboxClass_name) + 1 // + unknown
	sources := len(sandboxstatsv1.StatsSource_name) + 1
	return max((maxTemplates+1)*classes*sources, labelActorWorkloads)
}

// OTelContainerCardinalityLimit is the cardinality limit of the
// per-container instruments (sandboxstats.container.*) that they never
// reach legitimately: each workload label set (workloadSets) times
// maxContainers+1 containers (0: DefaultMaxContainers; its own and
// otherContainer).
func OTelContainerCardinalityLimit(maxTemplates, maxContainers int) int {
	if maxContainers <= 0 {
		maxContainers = DefaultMaxContainers
	}
	return workloadSets(maxTemplates) * (maxContainers + 1)
}

// OTelPipelineCardinalityLimit is the OTel SDK's cardinality limit for the
// agent's pipeline (one limit for all its instruments): the larger of the
// workload instruments' and the per-container ones'.
func OTelPipelineCardinalityLimit(maxTemplates, maxContainers int) int {
	return max(OTelCardinalityLimit(maxTemplates), OTelContainerCardinalityLimit(maxTemplates, maxContainers))
}

package nodeagent

import (
	"cmp"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// Metric names. Workload metrics are per label set: sandbox_class, source,
// template_namespace, template_name (and the actor labels with
// metricsConfig.LabelActor). Without actor labels, the workloads sharing a
// label set are summed; source is always a label, so samples of different
// sources are never summed.
const (
	metricMemoryCurrent    = "sandboxstats_workload_memory_current_bytes"
	metricMemoryWorkingSet = "sandboxstats_workload_memory_working_set_bytes"
	metricMemoryPeak       = "sandboxstats_workload_memory_peak_bytes"
	metricCPUSeconds       = "sandboxstats_workload_cpu_seconds_total"
	metricSandboxOwnCPU    = "sandboxstats_workload_sandbox_own_cpu_seconds_total"
	metricSampledWorkloads = "sandboxstats_sampled_workloads"
	metricDaemons          = "sandboxstats_agent_daemons"
	metricSweepDuration    = "sandboxstats_agent_sweep_duration_seconds"
	metricLastSweepSeconds = "sandboxstats_agent_last_sweep_duration_seconds"
	metricLastSweepTime    = "sandboxstats_agent_last_sweep_timestamp_seconds"
	metricSweeps           = "sandboxstats_agent_sweeps_total"
	metricPollErrors       = "sandboxstats_agent_poll_errors_total"
	metricDriftFindings    = "sandboxstats_drift_open_findings"
	metricMemoryLimit      = "sandboxstats_workload_memory_limit_bytes"
	metricPids             = "sandboxstats_workload_pids"

	// Hostile or broken daemons (see docs/statsagent.md, "Hostile daemons").
	metricActorConflicts = "sandboxstats_agent_actor_conflicts_total"
	metricRepliesCapped  = "sandboxstats_agent_replies_capped_total"
	metricSocketsRefused = "sandboxstats_agent_sockets_refused_total"

	// Per ended activation (each charged once), per template: no actor
	// labels however LabelActor is set (identity rides on the activation
	// log, not on labels).
	metricActivationsEnded   = "sandboxstats_activations_ended_total"
	metricActivationCPU      = "sandboxstats_activation_cpu_seconds"
	metricActivationPeak     = "sandboxstats_activation_memory_peak_bytes"
	metricActivationDuration = "sandboxstats_activation_duration_seconds"
	metricActivationFinals   = "sandboxstats_activation_final_samples_total"
	metricActivationNoPeak   = "sandboxstats_activation_memory_peak_missing_total"
)

// newAccountant returns an empty accountant of m's configuration.
func (m *metrics) newAccountant() *rate.Accountant {
	return rate.NewAccountant(rate.AccountantConfig{
		Started: m.cfg.Started, CPUs: m.cfg.CPUs, Horizon: m.cfg.EndedHorizon,
		PerInterface: m.cfg.LabelInterface, HeadSlack: rate.DefaultHeadSlack,
	})
}

// metricsConfig configures metrics.
type metricsConfig struct {
	// LabelActor adds actor_uid, actor_name and actor_namespace to the
	// workload metrics: one series per workload instead of per template.
	// Off by default because of cardinality.
	LabelActor bool
	// Grace is how long a workload's CPU counter (and a label set's total)
	// is remembered after it was last seen. A workload seen again within the
	// grace period continues its counter; after it, it is a first sight.
	Grace time.Duration
	// CPUs bounds how much CPU time a workload can have used since its
	// counter restarted (see rate.Accountant); 0 means the node's online
	// CPUs as CPUOnlinePath lists them (runtime.NumCPU(), this agent's
	// affinity, only when that cannot be read).
	CPUs int
	// CPUOnlinePath is the node's online CPU list (defaultCPUOnlinePath
	// where empty).
	CPUOnlinePath string
	// Started is when this agent started (rate.AccountantConfig.Started);
	// zero means when newMetrics ran.
	Started time.Time
	// EndedHorizon is how long an ended activation is remembered so that it
	// is charged once (rate.AccountantConfig.Horizon); default 1 h. It must
	// exceed statsd's --ended-retention.
	EndedHorizon time.Duration
	// ActivationLog, when set, gets one JSON line per ended activation
	// (ActivationRecord).
	ActivationLog io.Writer
	// LabelInterface exports the network counters per interface (an
	// interface label, at most rate.MaxInterfaces of a sample) instead of
	// their total over the interfaces but loopback.
	LabelInterface bool
	// MaxTemplates bounds the templates with label values of their own
	// (DefaultMaxTemplates when zero); the others are exported as
	// otherTemplate (see templateSlots).
	MaxTemplates int
	// OTel, when set, gets the same metrics over OpenTelemetry and the
	// usage events.
	OTel *OTel
	// LabelWorkerPool adds worker_pool (the identity's worker pool, empty
	// for none) to the workload and container metrics, beside the template
	// labels: its values are few (a pool per group of nodes), so it does
	// not multiply the series as the actor labels do; opt-in because it
	// changes every existing series' label set.
	LabelWorkerPool bool
	// MaxContainers bounds the containers of one sample with a container
	// label of their own (DefaultMaxContainers when zero).
	MaxContainers int
	// CAdvisorCompat also exports the per-container figures under
	// cAdvisor's names and labels (cadvisor.go).
	CAdvisorCompat bool
	// State, when set, keeps what was charged and delivered across
	// restarts (state.go); Started is then its origin.
	State *stateStore
}

// metrics is a prometheus.Collector over the latest sweep: the workload
// gauges are those of the last sweep only, so a workload that vanished
// disappears from them. Apply feeds it; it is safe for concurrent use.
type metrics struct {
	cfg        metricsConfig
	logger     *slog.Logger
	labelNames []string // of the workload metrics, in their Descs' order

	mu     sync.Mutex // serializes Apply
	acct   *rate.Accountant
	totals map[labelSet]*counterTotals
	// cacct charges the containers' CPU (containers.go); containers: the
	// per-container series.
	cacct            *rate.Accountant
	containers       map[containerKey]*containerValues
	ledgers          map[rate.ActivationKey]*containerLedger // what cacct was fed (containers_moved.go)
	containersFolded prometheus.Counter
	// owners: the socket each activation was sampled from, so that another
	// socket's sample or record of it is a conflict (never believed).
	owners map[rate.ActivationKey]owner
	// endedMarks: by socket, what the agent read of its ended records
	// (ended_gap.go).
	endedMarks map[string]endedMark
	// templates: the templates with label values of their own;
	// activations: the per-activation series, by template label set.
	templates   templateSlots
	activations map[labelSet]*activationCounts
	actLog      *json.Encoder // nil: no activation log
	otel        *otelMetrics  // nil: no OpenTelemetry export
	// state: the state directory (nil without --state-dir); pending: the
	// usage events not yet settled (nil without it, or without OTel).
	state   *stateStore
	pending *pendingEvents

	snap atomic.Pointer[snapshot]

	descCur, descWS, descPeak, descLimit, descPids, descSampled, descDaemons, descDrift *prometheus.Desc
	descCounters                                                                        [rate.NumCounters]*prometheus.Desc
	descCtrCPU, descCtrCur, descCtrWS, descCtrPids                                      *prometheus.Desc
	cadvisor                                                                            *cadvisorDescs // nil without CAdvisorCompat

	sweepDuration prometheus.Histogram
	lastSweep     prometheus.Gauge
	lastSweepTime prometheus.Gauge
	sweeps        prometheus.Counter
	pollErrors    *prometheus.CounterVec
	conflicts     prometheus.Counter
	capped        *prometheus.CounterVec // + part
	refused       *prometheus.CounterVec // + reason
	folded        prometheus.Counter
	endedLost     prometheus.Counter
	// overflows: charges refused because they would have made a shared
	// total overflow (read by a scrape while Apply adds).
	overflows atomic.Uint64

	ended       *prometheus.CounterVec   // + outcome
	finals      *prometheus.CounterVec   // + provenance
	noPeak      *prometheus.CounterVec   // + reason
	actCPU      *prometheus.HistogramVec // seconds
	actPeak     *prometheus.HistogramVec // bytes
	actDuration *prometheus.HistogramVec // seconds
}

// counterTotals are one label set's counters and when one of its
// workloads was last seen.
type counterTotals struct {
	values   counterValues
	lastSeen time.Time
}

// counterValues are one label set's counters, in each counter's unit: the
// sum of its activations' charges. CPU is there from the first measured
// sample on; another counter once some activation carried it. An array
// indexed by counter, not a map: Apply charges and copies every label
// set's counters at every sweep.
type counterValues struct {
	has   [rate.NumCounters]bool
	total [rate.NumCounters]uint64
	// perInterface are the network counters per interface
	// (LabelInterface), apart from the totals (not kept then).
	perInterface map[rate.CounterID]uint64
	// start is when the label set was first charged (a restart keeps it:
	// state.go): its series' start, as OTLP's start time and Prometheus's
	// created timestamp. A label set forgotten (Grace) starts again.
	start time.Time
}

// maxInterfacesPerSet bounds the interface names one label set exports
// (LabelInterface): a guest names its own interfaces and may name new ones
// every sweep, so past this many, charges to a name not yet exported go to
// otherInterface (the totals stay whole, the series count bounded).
const maxInterfacesPerSet = 64

// otherInterface is the interface label of what maxInterfacesPerSet folds.
const otherInterface = "(other)"

// add charges v to counter id; false (and nothing charged) when that
// would make the total overflow: a shared series never wraps and never
// sticks at the uint64 maximum (a neighbour's later charges still count).
func (cv *counterValues) add(id rate.CounterID, v uint64) bool {
	if id.Interface != "" {
		if cv.perInterface == nil {
			cv.perInterface = make(map[rate.CounterID]uint64)
		}
		if _, ok := cv.perInterface[id]; !ok && cv.interfaces(id.Interface) >= maxInterfacesPerSet {
			id.Interface = otherInterface
		}
		sum, carry := bits.Add64(cv.perInterface[id], v, 0)
		if carry != 0 {
			return false
		}
		cv.perInterface[id] = sum
		return true
	}
	cv.has[id.Counter] = true
	sum, carry := bits.Add64(cv.total[id.Counter], v, 0)
	if carry != 0 {
		return false
	}
	cv.total[id.Counter] = sum
	return true
}

// interfaces counts the interface names cv exports besides name and
// otherInterface.
func (cv *counterValues) interfaces(name string) int {
	names := map[string]bool{}
	for id := range cv.perInterface {
		if id.Interface != name && id.Interface != otherInterface {
			names[id.Interface] = true
		}
	}
	return len(names)
}

// clone returns a copy of cv that later charges to cv leave alone.
func (cv *counterValues) clone() *counterValues {
	c := *cv
	c.perInterface = maps.Clone(cv.perInterface)
	return &c
}

type owner struct {
	socket   string
	lastSeen time.Time
}

type seriesValues struct {
	workloads      int
	current, wset  uint64
	peak           uint64
	peakIncomplete bool // a workload of the set has no peak: no peak series
	limit          uint64
	limitMissing   bool // a workload of the set is unlimited or has no limit: no limit series
	pids           uint64
	pidsMissing    bool // a workload of the set has no pids: no pids series
}

// driftKey is one drift gauge series: a finding kind and its workload's labels.
type driftKey struct {
	kind   string
	labels labelSet
}

type snapshot struct {
	drift    map[driftKey]int
	series   map[labelSet]*seriesValues
	counters map[labelSet]*counterValues // charged, in each counter's unit
	// activations: the per-activation counts (OTel only; nil without it).
	activations map[labelSet]*activationCounts
	daemons     map[sweep.Status]int
	// containers: the per-container series (containers.go).
	containers map[containerKey]*containerValues
}

// newMetrics returns metrics and registers them, with the agent's own sweep
// metrics, on reg.
func newMetrics(reg prometheus.Registerer, cfg metricsConfig, logger *slog.Logger) (*metrics, error) {
	labels := []string{"sandbox_class", "source", "template_namespace", "template_name"}
	if cfg.LabelWorkerPool {
		labels = append(labels, "worker_pool")
	}
	if cfg.LabelActor {
		labels = append(labels, "actor_uid", "actor_name", "actor_namespace")
	}
	if cfg.Started.IsZero() {
		cfg.Started = time.Now()
	}
	cfg.EndedHorizon = cmp.Or(cfg.EndedHorizon, time.Hour)
	if cfg.CPUs <= 0 {
		n, err := nodeCPUs(cmp.Or(cfg.CPUOnlinePath, defaultCPUOnlinePath))
		if err != nil {
			logger.Warn("the node's online CPUs could not be read: bounding CPU by this agent's (its affinity may be fewer than the node's)",
				"path", cmp.Or(cfg.CPUOnlinePath, defaultCPUOnlinePath), "cpus", n, "err", err)
		}
		cfg.CPUs = n
	}
	templateLabels := []string{"sandbox_class", "source", "template_namespace", "template_name"}
	m := &metrics{
		cfg:          cfg,
		logger:       logger,
		labelNames:   labels,
		totals:       make(map[labelSet]*counterTotals),
		templates:    templateSlots{max: cmp.Or(cfg.MaxTemplates, DefaultMaxTemplates), slots: map[templateKey]*templateUse{}},
		activations:  make(map[labelSet]*activationCounts),
		owners:       make(map[rate.ActivationKey]owner),
		endedMarks:   make(map[string]endedMark),
		endedLost:    newEndedLostCounter(),
		descCounters: counterDescs(labels, cfg.LabelInterface),
		containers:   make(map[containerKey]*containerValues),
		descCtrCPU: prometheus.NewDesc(metricContainerCPU,
			"CPU time of each container of the workloads with these labels (counter, seconds, layer: source: the guest cgroup of each container, the sentry's per-container accounting), charged like "+metricCPUSeconds+" (head, body, tail, across restarts with --state-dir); never decreases. Past --max-containers a workload's containers are container=\"(other)\".", append(labels[:len(labels):len(labels)], "container"), nil),
		descCtrCur: prometheus.NewDesc(metricContainerMemory,
			"Memory charged now to each container (gauge, bytes, layer: source), summed over the workloads with these labels; absent where the source has no figure of the container's own (gVisor's sandbox total or even split is never one).", append(labels[:len(labels):len(labels)], "container"), nil),
		descCtrWS: prometheus.NewDesc(metricContainerWorkingSet,
			"Memory current minus inactive file pages of each container (gauge, bytes, layer: source), summed; absent where the source has none of the container's own.", append(labels[:len(labels):len(labels)], "container"), nil),
		descCtrPids: prometheus.NewDesc(metricContainerPids,
			"Processes (tasks) of each container (gauge, tasks, layer: source), summed; absent where the source offers none.", append(labels[:len(labels):len(labels)], "container"), nil),
		containersFolded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricContainersFolded, Help: "Containers (one a sample, and one an ended record's final) exported as container=\"(other)\": their workload had more than --max-containers.",
		}),
		descCur: prometheus.NewDesc(metricMemoryCurrent,
			"Memory charged now (gauge, bytes, layer: source), summed over the sampled workloads with these labels.", labels, nil),
		descWS: prometheus.NewDesc(metricMemoryWorkingSet,
			"Memory current minus inactive file pages (gauge, bytes, layer: source), summed over the sampled workloads with these labels.", labels, nil),
		descPeak: prometheus.NewDesc(metricMemoryPeak,
			"Peak memory within each workload's epoch (peak, bytes, layer: source), summed over the sampled workloads with these labels (an upper bound on the peak of the sum); absent when a workload's source offers no peak.", labels, nil),
		descLimit: prometheus.NewDesc(metricMemoryLimit,
			"Memory limit in force (gauge, bytes, layer: source: v2 memory.max, v1 memory.limit_in_bytes, the guest agent's limit), summed over the sampled workloads with these labels; absent when any of them is unlimited or offers no limit (unlimited is not a number).", labels, nil),
		descPids: prometheus.NewDesc(metricPids,
			"Processes (tasks) in the sandboxes (gauge, tasks, layer: source: pids.current, guest pids_stats), summed over the sampled workloads with these labels; absent when any of them offers none.", labels, nil),
		descSampled: prometheus.NewDesc(metricSampledWorkloads,
			"Workloads in the last sweep (gauge); source=\"unspecified\" counts workloads bound but not measured.", labels, nil),
		descDrift: prometheus.NewDesc(metricDriftFindings,
			"Open drift findings (gauge): where what statsd was told no longer matches what runs, by kind (see docs/drift.md).", append([]string{"kind"}, labels...), nil),
		descDaemons: prometheus.NewDesc(metricDaemons,
			"Daemons found by the last sweep, by outcome (gauge).", []string{"result"}, nil),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricSweepDuration,
			Help:    "Wall time of one sweep: discovery plus every poll (seconds).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
		lastSweep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricLastSweepSeconds, Help: "Wall time of the last sweep (seconds).",
		}),
		lastSweepTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricLastSweepTime, Help: "When the last sweep finished (unix seconds).",
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricSweeps, Help: "Sweeps completed.",
		}),
		pollErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPollErrors, Help: "Failed StatsActiveWorkloads polls, by gRPC code (a vanished daemon is not an error; PermissionDenied: the server's uid is not allowed; ResourceExhausted: an answer over a cap; unknown: a code gRPC does not define).",
		}, []string{"code"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricActorConflicts, Help: "Actors whose samples or ended records came from more than one daemon (in one sweep, or from another daemon than the one their activation was sampled from): none of them is believed.",
		}),
		capped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricRepliesCapped, Help: "Answers with a part over its per-daemon cap, dropped whole, by part: samples (the whole answer), drift-findings, ended, reply-bytes (the whole answer).",
		}, []string{"part"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricSocketsRefused, Help: "Sockets matched by the glob and not polled, by reason: symlink, owner (not an allowed uid), duplicate (the same socket under another name), peer (the server's uid is not allowed).",
		}, []string{"reason"}),
		folded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricTemplatesFolded, Help: "Samples (one a sweep) and ended activations whose template was exported as template_namespace and template_name \"(other)\": --max-templates other templates held a slot (see docs/statsagent.md).",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricActivationsEnded, Help: "Activations that ended (each once), by how: checkpointed, sandbox-dead, oom-killed, replaced.",
		}, append(templateLabels[:4:4], "outcome")),
		finals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricActivationFinals, Help: "Ended activations by how their final sample was obtained: read-at-end, last-good-poll (usage after it is missing), none.",
		}, append(templateLabels[:4:4], "provenance")),
		noPeak: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricActivationNoPeak, Help: "Ended activations left out of " + metricActivationPeak + ": lower-bound (the source offers no peak; only the highest current seen is known) or absent.",
		}, append(templateLabels[:4:4], "reason")),
		actCPU: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricActivationCPU, Help: "CPU time of each ended activation (seconds, its own: final minus the epoch baseline); _sum is the CPU the activations used.",
			Buckets: cpuBounds,
		}, templateLabels),
		actPeak: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricActivationPeak, Help: "Peak memory of each ended activation (bytes, the source's peak within the epoch).",
			Buckets: peakBounds,
		}, templateLabels),
		actDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricActivationDuration, Help: "Wall time of each ended activation, from its Run/Restore to its end (seconds).",
			Buckets: durationBounds,
		}, templateLabels),
	}
	if cfg.ActivationLog != nil {
		m.actLog = json.NewEncoder(cfg.ActivationLog)
	}
	m.acct = m.newAccountant()
	m.cacct = m.newAccountant()
	if cfg.CAdvisorCompat {
		m.cadvisor = newCAdvisorDescs()
	}
	m.snap.Store(&snapshot{})
	m.state = cfg.State
	if cfg.OTel != nil {
		o, err := newOTelMetrics(*cfg.OTel, m)
		if err != nil {
			return nil, err
		}
		m.otel = o
		if m.state != nil {
			m.pending = newPendingEvents()
			o.pending = m.pending
		}
	}
	if m.state != nil {
		if err := reg.Register(m.state.saves); err != nil {
			return nil, err
		}
	}
	for _, c := range []prometheus.Collector{m, m.sweepDuration, m.lastSweep, m.lastSweepTime, m.sweeps, m.pollErrors,
		m.conflicts, m.capped, m.refused, m.folded, m.containersFolded, m.endedLost, m.ended, m.finals, m.noPeak, m.actCPU, m.actPeak, m.actDuration, newRefusedCollector(m.acct, &m.overflows)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// OTel is where the agent's metrics and usage events go besides
// Prometheus: the OpenTelemetry providers of an OTLP pipeline
// (internal/otlp). Every name, unit and attribute is in
// docs/telemetry/registry.yaml, which TestRegistry holds these files to.
type OTel struct {
	// Meters are the metrics: the same snapshot the Prometheus export
	// serves, observed when the provider's reader collects (the workload
	// counters and per-activation distributions by Distributions).
	Meters metric.MeterProvider
	// Loggers get the usage events (EventUsageSampled) as log records.
	Loggers otellog.LoggerProvider
	// PeriodicEvery: a periodic event of every workload at every Nth sweep
	// (1: every sweep); 0: none. The initial and final events are always
	// sent.
	PeriodicEvery int
	// Distributions exports the workload counters and the per-activation
	// distributions: it must be a producer of the reader of Meters'
	// provider. Required.
	Distributions *Distributions
	// Swept, when set, is called after each sweep became the latest (the
	// pipeline's cue to export it); it must not block.
	Swept func()
}

// Instrumentation scope of the agent's meters and loggers.
const otelScope = "github.com/sandboxstats/sandboxstats/internal/nodeagent"

// EventUsageSampled is the name of every usage event: one activation's
// usage at its first sample (kind initial), at a sweep (periodic) and at
// its end (final).
const EventUsageSampled = "sandboxstats.workload.usage_sampled"

// Kinds of usage event (attribute sandboxstats.stats.kind).
const (
	KindInitial  = "initial"
	KindPeriodic = "periodic"
	KindFinal    = "final"
	// KindLost: ended records of one daemon dropped before this agent read
	// them (ended_gap.go).
	KindLost = "lost"
)

// Attribute keys. The workload attributes are those of the Prometheus
// labels (sandbox_class, source, template_namespace, template_name, and
// the actor's with LabelActor), under the project's namespace.
const (
	attrClass             = "sandboxstats.sandbox.class"
	attrSource            = "sandboxstats.stats.source"
	attrTemplateNamespace = "sandboxstats.template.namespace"
	attrTemplateName      = "sandboxstats.template.name"
	attrActorUID          = "sandboxstats.actor.uid"
	attrActorName         = "sandboxstats.actor.name"
	attrActorNamespace    = "sandboxstats.actor.namespace"
	attrWorkerPool        = "sandboxstats.workerpool.name"

	attrNetDirection  = "network.io.direction"   // semantic conventions: receive, transmit
	attrNetInterface  = "network.interface.name" // semantic conventions
	attrDiskDirection = "disk.io.direction"      // semantic conventions: read, write
	attrPSIResource   = "sandboxstats.pressure.resource"
	attrDriftKind     = "sandboxstats.drift.kind"
	attrOutcome       = "sandboxstats.activation.outcome"
	attrProvenance    = "sandboxstats.activation.final_provenance"
	attrPeakMissing   = "sandboxstats.activation.peak_missing"
	attrResult        = "sandboxstats.agent.poll_result"
	attrGRPCCode      = "rpc.grpc.status_code_name"

	// Event attributes besides the workload's.
	attrKind          = "sandboxstats.stats.kind"
	attrEpoch         = "sandboxstats.activation.epoch"
	attrMemUsage      = "sandboxstats.stats.memory.usage"
	attrMemWorkingSet = "sandboxstats.stats.memory.working_set"
	attrMemPeak       = "sandboxstats.stats.memory.peak"
	attrMemPeakLower  = "sandboxstats.stats.memory.peak_is_lower_bound"
	attrCPUTime       = "sandboxstats.stats.cpu.time"
	attrEnd           = "sandboxstats.activation.end"
	attrDuration      = "sandboxstats.activation.duration"
	attrFinalAge      = "sandboxstats.activation.final_age"
	attrFinalReason   = "sandboxstats.activation.final_reason"
	attrCharged       = "sandboxstats.activation.charged_cpu_time"
	attrCharge        = "sandboxstats.activation.charge"
	attrBaselineDelay = "sandboxstats.activation.baseline_delay"
	attrDaemon        = "sandboxstats.daemon.socket"
	attrObservedAt    = "sandboxstats.stats.observed_at"
	attrInstance      = "sandboxstats.ended.instance_id"
	attrSequence      = "sandboxstats.ended.sequence"
	attrLostRecords   = "sandboxstats.ended.lost_records"
	attrLostFrom      = "sandboxstats.ended.lost_from_sequence"
	attrLostTo        = "sandboxstats.ended.lost_to_sequence"
)

// otelCounter is the OTLP counter one rate.Counter is exported as: its
// name, unit, scale (µs into seconds) and the attribute that tells it from
// the other counters of the same name (a direction, a PSI resource).
type otelCounter struct {
	name, unit string
	scale      float64 // 0: an integer counter
	extra      attribute.KeyValue
	help       string
}

// otelCounters names the OTLP export of every counter the Accountant
// charges: the semantic conventions' names where they exist
// (container.cpu.time, container.network.io, container.disk.io), the
// project's elsewhere.
var otelCounters = [rate.NumCounters]otelCounter{
	rate.CounterCPU:              {"container.cpu.time", "s", 1e-6, attribute.KeyValue{}, "CPU time of the sandboxes, charged by activation from its first to its last microsecond."},
	rate.CounterThrottledUsec:    {"sandboxstats.workload.cpu.throttled.time", "s", 1e-6, attribute.KeyValue{}, "Time the CFS bandwidth quota kept the workloads from running."},
	rate.CounterPeriods:          {"sandboxstats.workload.cpu.periods", "{period}", 0, attribute.KeyValue{}, "CFS bandwidth periods that elapsed with the workloads runnable."},
	rate.CounterThrottledPeriods: {"sandboxstats.workload.cpu.throttled.periods", "{period}", 0, attribute.KeyValue{}, "CFS bandwidth periods in which the workloads' quota ran out."},
	rate.CounterPressureCPUSome:  {"sandboxstats.workload.pressure.waiting.time", "s", 1e-6, attribute.String(attrPSIResource, "cpu"), "Time in which some of the workloads' tasks waited for the resource (PSI some total)."},
	rate.CounterPressureCPUFull:  {"sandboxstats.workload.pressure.stalled.time", "s", 1e-6, attribute.String(attrPSIResource, "cpu"), "Time in which all the workloads' non-idle tasks stalled on the resource (PSI full total)."},
	rate.CounterPressureMemSome:  {"sandboxstats.workload.pressure.waiting.time", "s", 1e-6, attribute.String(attrPSIResource, "memory"), ""},
	rate.CounterPressureMemFull:  {"sandboxstats.workload.pressure.stalled.time", "s", 1e-6, attribute.String(attrPSIResource, "memory"), ""},
	rate.CounterPressureIOSome:   {"sandboxstats.workload.pressure.waiting.time", "s", 1e-6, attribute.String(attrPSIResource, "io"), ""},
	rate.CounterPressureIOFull:   {"sandboxstats.workload.pressure.stalled.time", "s", 1e-6, attribute.String(attrPSIResource, "io"), ""},
	rate.CounterOOMKills:         {"sandboxstats.workload.oom_kills", "{kill}", 0, attribute.KeyValue{}, "Processes the kernel's OOM killer killed in the sandboxes."},
	rate.CounterNetRxBytes:       {"container.network.io", "By", 0, attribute.String(attrNetDirection, "receive"), "Network bytes of the sandboxes, summed over the interfaces but loopback (per interface with --label-interface)."},
	rate.CounterNetTxBytes:       {"container.network.io", "By", 0, attribute.String(attrNetDirection, "transmit"), ""},
	rate.CounterNetRxPackets:     {"sandboxstats.workload.network.packets", "{packet}", 0, attribute.String(attrNetDirection, "receive"), "Network packets of the sandboxes."},
	rate.CounterNetTxPackets:     {"sandboxstats.workload.network.packets", "{packet}", 0, attribute.String(attrNetDirection, "transmit"), ""},
	rate.CounterNetRxErrors:      {"sandboxstats.workload.network.errors", "{error}", 0, attribute.String(attrNetDirection, "receive"), "Network errors of the sandboxes."},
	rate.CounterNetTxErrors:      {"sandboxstats.workload.network.errors", "{error}", 0, attribute.String(attrNetDirection, "transmit"), ""},
	rate.CounterNetRxDropped:     {"sandboxstats.workload.network.dropped", "{packet}", 0, attribute.String(attrNetDirection, "receive"), "Network packets of the sandboxes dropped."},
	rate.CounterNetTxDropped:     {"sandboxstats.workload.network.dropped", "{packet}", 0, attribute.String(attrNetDirection, "transmit"), ""},
	rate.CounterIOReadBytes:      {"container.disk.io", "By", 0, attribute.String(attrDiskDirection, "read"), "Block device bytes the kernel charged to the sandboxes."},
	rate.CounterIOWriteBytes:     {"container.disk.io", "By", 0, attribute.String(attrDiskDirection, "write"), ""},
	rate.CounterIOReadOps:        {"sandboxstats.workload.disk.operations", "{operation}", 0, attribute.String(attrDiskDirection, "read"), "Block device operations the kernel charged to the sandboxes."},
	rate.CounterIOWriteOps:       {"sandboxstats.workload.disk.operations", "{operation}", 0, attribute.String(attrDiskDirection, "write"), ""},
	rate.CounterSandboxOwnCPU:    {"sandboxstats.workload.sandbox_own.cpu.time", "s", 1e-6, attribute.KeyValue{}, "The sandboxes' own share of container.cpu.time (gVisor: the sentry's and gofers' host CPU and the pause container's part): the containers' CPU plus this is the pod's."},
}

// otelMetrics are the agent's OTel instruments and event logger; nil
// without Config.OTel.
type otelMetrics struct {
	cfg    OTel
	logger otellog.Logger

	memUsage, memWorkingSet, memPeak, memLimit, pids, sampled, drift, daemons metric.Int64Observable
	containers                                                                containerInstruments
	// The workload counters are Distributions' (each series' own start
	// time).

	// ended, finals, noPeak: observed from the snapshot's activation
	// counts, so that a template's series leave with them (a synchronous
	// counter's are kept for ever by the SDK).
	ended, finals, noPeak                 metric.Int64ObservableCounter
	sweeps, pollErrors, conflicts, folded metric.Int64Counter
	endedLost                             metric.Int64Counter
	sweepDuration                         metric.Float64Histogram
	// The per-activation histograms are Distributions (the SDK's would
	// keep every template's point for ever).

	mu sync.Mutex // the callback's attribute sets, by label set:
	// workload label sets, and template label sets (no actor attributes)
	attrs, tmplAttrs map[labelSet]*labelAttrs

	sweepNo uint64 // Apply's count, for PeriodicEvery (under metrics.mu)

	// pending: the events not yet settled, kept in the state file (nil
	// without --state-dir).
	pending *pendingEvents
}

// newOTelMetrics makes the instruments of cfg's meter and registers the
// callback that observes m's latest snapshot.
func newOTelMetrics(cfg OTel, m *metrics) (*otelMetrics, error) {
	if cfg.Distributions == nil {
		return nil, errors.New("otel: no Distributions: the workload counters would not be exported")
	}
	o := &otelMetrics{cfg: cfg, attrs: map[labelSet]*labelAttrs{}, tmplAttrs: map[labelSet]*labelAttrs{}}
	meter := cfg.Meters.Meter(otelScope)
	if cfg.Loggers != nil {
		o.logger = cfg.Loggers.Logger(otelScope)
	}
	var err error
	upDown := func(name, unit, desc string) metric.Int64Observable {
		if err != nil {
			return nil
		}
		var inst metric.Int64ObservableUpDownCounter
		inst, err = meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return inst
	}
	gauge := func(name, unit, desc string) metric.Int64Observable {
		if err != nil {
			return nil
		}
		var inst metric.Int64ObservableGauge
		inst, err = meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return inst
	}
	o.memUsage = upDown("container.memory.usage", "By", "Memory charged now (layer: source), summed over the sampled workloads with these attributes.")
	o.memWorkingSet = upDown("container.memory.working_set", "By", "Memory current minus inactive file pages (layer: source), summed over the sampled workloads with these attributes.")
	o.memPeak = gauge("sandboxstats.workload.memory.peak", "By", "Peak memory within each workload's epoch, summed (an upper bound on the peak of the sum); absent when a workload's source offers no peak.")
	o.memLimit = gauge("sandboxstats.workload.memory.limit", "By", "Memory limit in force, summed; absent when any workload is unlimited or offers no limit.")
	o.pids = gauge("sandboxstats.workload.pids", "{process}", "Processes (tasks) in the sandboxes, summed; absent when any workload offers none.")
	o.sampled = gauge("sandboxstats.workloads.sampled", "{workload}", "Workloads in the last sweep; source unspecified counts workloads bound but not measured.")
	o.drift = gauge("sandboxstats.drift.open_findings", "{finding}", "Open drift findings, by kind (docs/drift.md).")
	o.daemons = gauge("sandboxstats.agent.daemons", "{daemon}", "Daemons found by the last sweep, by outcome.")
	observables := []metric.Observable{o.memUsage, o.memWorkingSet, o.memPeak, o.memLimit, o.pids, o.sampled, o.drift, o.daemons}
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var inst metric.Int64Counter
		inst, err = meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return inst
	}
	observed := func(name, unit, desc string) metric.Int64ObservableCounter {
		if err != nil {
			return nil
		}
		var inst metric.Int64ObservableCounter
		inst, err = meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		observables = append(observables, inst)
		return inst
	}
	o.ended = observed("sandboxstats.activations.ended", "{activation}", "Activations that ended (each once), by outcome.")
	o.finals = observed("sandboxstats.activation.final_samples", "{activation}", "Ended activations by how their final sample was obtained.")
	o.noPeak = observed("sandboxstats.activation.memory.peak_missing", "{activation}", "Ended activations left out of sandboxstats.activation.memory.peak: lower-bound or absent.")
	o.folded = counter("sandboxstats.agent.templates_folded", "{observation}", "Samples (one a sweep) and ended activations whose template was exported as (other): --max-templates other templates held a slot.")
	o.endedLost = counter("sandboxstats.agent.ended_records.lost", "{record}", "Ended records a statsd dropped before this agent read them (a gap in its instance's sequences).")
	o.sweeps = counter("sandboxstats.agent.sweeps", "{sweep}", "Sweeps completed.")
	o.pollErrors = counter("sandboxstats.agent.poll_errors", "{error}", "Failed StatsActiveWorkloads polls, by gRPC code.")
	o.conflicts = counter("sandboxstats.agent.actor_conflicts", "{actor}", "Actors whose samples or ended records came from more than one daemon: none of them believed.")
	if err == nil {
		o.containers, err = newContainerInstruments(meter)
		observables = append(observables, o.containers.memUsage, o.containers.memWorkingSet, o.containers.pids)
	}
	if err == nil {
		o.sweepDuration, err = meter.Float64Histogram("sandboxstats.agent.sweep.duration", metric.WithUnit("s"),
			metric.WithDescription("Wall time of one sweep: discovery plus every poll."),
			metric.WithExplicitBucketBoundaries(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
	}
	if err != nil {
		return nil, fmt.Errorf("otel instruments: %w", err)
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		snap := m.snap.Load()
		o.observe(obs, snap, m.cfg.LabelActor)
		o.containers.observeContainers(obs, snap, m.cfg.LabelActor)
		return nil
	}, observables...); err != nil {
		return nil, fmt.Errorf("otel callback: %w", err)
	}
	cfg.Distributions.m.Store(m)
	return o, nil
}

// templatesFolded counts a fold (metrics.fold).
func (o *otelMetrics) templatesFolded() { o.folded.Add(context.Background(), 1) }

// swept records a finished sweep.
func (o *otelMetrics) swept(took time.Duration) {
	ctx := context.Background()
	o.sweeps.Add(ctx, 1)
	o.sweepDuration.Record(ctx, took.Seconds())
	o.sweepNo++
}

// periodic reports whether this sweep sends periodic events.
func (o *otelMetrics) periodic() bool {
	return o.logger != nil && o.cfg.PeriodicEvery > 0 && (o.sweepNo+1)%uint64(o.cfg.PeriodicEvery) == 0
}

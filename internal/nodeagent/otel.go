package nodeagent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// OTel is where the agent's metrics and usage events go besides
// Prometheus: the OpenTelemetry providers of an OTLP pipeline
// (internal/otlp). Every name, unit and attribute is in
// docs/telemetry/registry.yaml, which TestRegistry holds this file to.
type OTel struct {
	// Meters are the metrics: the same snapshot the Prometheus export
	// serves, observed when the provider's reader collects, and the
	// per-activation counters and distributions as they are charged.
	Meters metric.MeterProvider
	// Loggers get the usage events (EventUsageSampled) as log records.
	Loggers otellog.LoggerProvider
	// PeriodicEvery: a periodic event of every workload at every Nth sweep
	// (1: every sweep); 0: none. The initial and final events are always
	// sent.
	PeriodicEvery int
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
}

// otelMetrics are the agent's OTel instruments and event logger; nil
// without Config.OTel.
type otelMetrics struct {
	cfg    OTel
	logger otellog.Logger

	memUsage, memWorkingSet, memPeak, memLimit, pids, sampled, drift, daemons metric.Int64Observable
	intCounters                                                               map[string]metric.Int64ObservableCounter
	floatCounters                                                             map[string]metric.Float64ObservableCounter

	ended, finals, noPeak, sweeps, pollErrors, conflicts metric.Int64Counter
	actCPU, actDuration, sweepDuration                   metric.Float64Histogram
	actPeak                                              metric.Int64Histogram

	mu    sync.Mutex // the callback's attribute sets, by label set
	attrs map[labelSet]*labelAttrs

	sweepNo uint64 // Apply's count, for PeriodicEvery (under metrics.mu)
}

// newOTelMetrics makes the instruments of cfg's meter and registers the
// callback that observes m's latest snapshot.
func newOTelMetrics(cfg OTel, m *metrics) (*otelMetrics, error) {
	o := &otelMetrics{cfg: cfg, intCounters: map[string]metric.Int64ObservableCounter{}, floatCounters: map[string]metric.Float64ObservableCounter{},
		attrs: map[labelSet]*labelAttrs{}}
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
	for _, c := range otelCounters {
		if err != nil {
			break
		}
		if c.scale != 0 {
			if _, ok := o.floatCounters[c.name]; !ok {
				var inst metric.Float64ObservableCounter
				inst, err = meter.Float64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.help))
				o.floatCounters[c.name] = inst
				observables = append(observables, inst)
			}
		} else if _, ok := o.intCounters[c.name]; !ok {
			var inst metric.Int64ObservableCounter
			inst, err = meter.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.help))
			o.intCounters[c.name] = inst
			observables = append(observables, inst)
		}
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var inst metric.Int64Counter
		inst, err = meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return inst
	}
	o.ended = counter("sandboxstats.activations.ended", "{activation}", "Activations that ended (each once), by outcome.")
	o.finals = counter("sandboxstats.activation.final_samples", "{activation}", "Ended activations by how their final sample was obtained.")
	o.noPeak = counter("sandboxstats.activation.memory.peak_missing", "{activation}", "Ended activations left out of sandboxstats.activation.memory.peak: lower-bound or absent.")
	o.sweeps = counter("sandboxstats.agent.sweeps", "{sweep}", "Sweeps completed.")
	o.pollErrors = counter("sandboxstats.agent.poll_errors", "{error}", "Failed StatsActiveWorkloads polls, by gRPC code.")
	o.conflicts = counter("sandboxstats.agent.actor_conflicts", "{actor}", "Actors whose samples or ended records came from more than one daemon: none of them believed.")
	if err == nil {
		o.actCPU, err = meter.Float64Histogram("sandboxstats.activation.cpu.time", metric.WithUnit("s"),
			metric.WithDescription("CPU time of each ended activation (its own: final minus the epoch baseline)."),
			metric.WithExplicitBucketBoundaries(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4*3600))
	}
	if err == nil {
		o.actDuration, err = meter.Float64Histogram("sandboxstats.activation.duration", metric.WithUnit("s"),
			metric.WithDescription("Wall time of each ended activation, from its Run/Restore to its end."),
			metric.WithExplicitBucketBoundaries(1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4*3600, 12*3600, 24*3600))
	}
	if err == nil {
		bounds := make([]float64, 13) // 16 MiB .. 64 GiB, as the Prometheus histogram
		for i := range bounds {
			bounds[i] = float64(int64(16<<20) << i)
		}
		o.actPeak, err = meter.Int64Histogram("sandboxstats.activation.memory.peak", metric.WithUnit("By"),
			metric.WithDescription("Peak memory of each ended activation (the source's peak within the epoch)."),
			metric.WithExplicitBucketBoundaries(bounds...))
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
		o.observe(obs, m.snap.Load(), m.cfg.LabelActor)
		return nil
	}, observables...); err != nil {
		return nil, fmt.Errorf("otel callback: %w", err)
	}
	return o, nil
}

// labelAttrs are one label set's measurement options, made once while the
// label set is in the snapshots: its attributes alone, and with each extra
// attribute (a counter's direction or PSI resource, an interface, a drift
// kind).
type labelAttrs struct {
	base  metric.MeasurementOption
	set   attribute.Set
	extra map[extraKey]metric.MeasurementOption
}

// extraKey names one list of extra attributes: a counter's own and an
// interface, or a drift kind.
type extraKey struct {
	counter     rate.Counter
	iface, kind string
}

// with returns la's options with the extra attributes key names, made by
// extra the first time.
func (la *labelAttrs) with(key extraKey, extra func() []attribute.KeyValue) metric.MeasurementOption {
	if opt, ok := la.extra[key]; ok {
		return opt
	}
	kv := extra()
	if len(kv) == 0 {
		return la.base
	}
	opt := metric.WithAttributeSet(attribute.NewSet(append(la.set.ToSlice(), kv...)...))
	if la.extra == nil {
		la.extra = map[extraKey]metric.MeasurementOption{}
	}
	la.extra[key] = opt
	return opt
}

// labels returns l's options, kept in seen for the next collection.
func (o *otelMetrics) labels(l labelSet, withActor bool, seen map[labelSet]*labelAttrs) *labelAttrs {
	if la, ok := seen[l]; ok {
		return la
	}
	la, ok := o.attrs[l]
	if !ok {
		set := attribute.NewSet(workloadAttrs(l, withActor)...)
		la = &labelAttrs{set: set, base: metric.WithAttributeSet(set)}
	}
	seen[l] = la
	return la
}

func workloadAttrs(l labelSet, withActor bool) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String(attrClass, l.class), attribute.String(attrSource, l.source),
		attribute.String(attrTemplateNamespace, l.templateNamespace), attribute.String(attrTemplateName, l.templateName),
	}
	if withActor {
		kv = append(kv, attribute.String(attrActorUID, l.actorUID), attribute.String(attrActorName, l.actorName),
			attribute.String(attrActorNamespace, l.actorNamespace))
	}
	return kv
}

// observe reports snap: the numbers the Prometheus export serves, each
// absent where it is (not measured, no peak, unlimited), never zero.
func (o *otelMetrics) observe(obs metric.Observer, snap *snapshot, withActor bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	seen := make(map[labelSet]*labelAttrs, len(o.attrs))
	for l, sv := range snap.series {
		la := o.labels(l, withActor, seen)
		obs.ObserveInt64(o.sampled, int64(sv.workloads), la.base)
		if l.source == unmeasuredSource || l.source == unknownLabel {
			continue
		}
		obs.ObserveInt64(o.memUsage, clampInt64(sv.current), la.base)
		obs.ObserveInt64(o.memWorkingSet, clampInt64(sv.wset), la.base)
		if !sv.peakIncomplete {
			obs.ObserveInt64(o.memPeak, clampInt64(sv.peak), la.base)
		}
		if !sv.limitMissing {
			obs.ObserveInt64(o.memLimit, clampInt64(sv.limit), la.base)
		}
		if !sv.pidsMissing {
			obs.ObserveInt64(o.pids, clampInt64(sv.pids), la.base)
		}
	}
	count := func(c rate.Counter, la *labelAttrs, v uint64, iface string) {
		oc := otelCounters[c]
		opt := la.base
		if oc.extra.Key != "" || iface != "" {
			opt = la.with(extraKey{counter: c, iface: iface}, func() []attribute.KeyValue {
				var extra []attribute.KeyValue
				if oc.extra.Key != "" {
					extra = append(extra, oc.extra)
				}
				if iface != "" {
					extra = append(extra, attribute.String(attrNetInterface, iface))
				}
				return extra
			})
		}
		if oc.scale != 0 {
			obs.ObserveFloat64(o.floatCounters[oc.name], float64(v)*oc.scale, opt)
		} else {
			obs.ObserveInt64(o.intCounters[oc.name], clampInt64(v), opt)
		}
	}
	for l, cv := range snap.counters {
		la := o.labels(l, withActor, seen)
		for c, v := range cv.total {
			if cv.has[c] {
				count(rate.Counter(c), la, v, "")
			}
		}
		for id, v := range cv.perInterface {
			count(id.Counter, la, v, id.Interface)
		}
	}
	for k, n := range snap.drift {
		la := o.labels(k.labels, withActor, seen)
		obs.ObserveInt64(o.drift, int64(n), la.with(extraKey{kind: k.kind}, func() []attribute.KeyValue {
			return []attribute.KeyValue{attribute.String(attrDriftKind, k.kind)}
		}))
	}
	if snap.daemons != nil {
		for _, st := range []sweep.Status{sweep.StatusOK, sweep.StatusNoSample, sweep.StatusVanished, sweep.StatusError, sweep.StatusSkipped} {
			obs.ObserveInt64(o.daemons, int64(snap.daemons[st]), metric.WithAttributes(attribute.String(attrResult, string(st))))
		}
	}
	o.attrs = seen // forget the label sets no longer in the snapshot
}

// clampInt64 is v as an int64, the largest int64 above it (a hostile
// daemon's sums saturate at the largest uint64).
func clampInt64(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}

// templateAttrs are an ended activation's per-template attributes, as its
// Prometheus distributions' labels.
func templateAttrs(l labelSet, extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(workloadAttrs(l, false), extra...)...)
}

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

// endedCounted records an ended activation in the OTel counters and
// distributions, as addEnded does in Prometheus's.
func (o *otelMetrics) endedCounted(tmpl labelSet, e *sandboxstatsv1.EndedActivation) {
	ctx := context.Background()
	o.ended.Add(ctx, 1, templateAttrs(tmpl, attribute.String(attrOutcome, api.OutcomeName(e.GetOutcome()))))
	o.finals.Add(ctx, 1, templateAttrs(tmpl, attribute.String(attrProvenance, api.ProvenanceName(e.GetFinalProvenance()))))
	if e.CpuUsec != nil {
		o.actCPU.Record(ctx, float64(e.GetCpuUsec())/1e6, templateAttrs(tmpl))
	}
	switch {
	case e.MemoryPeakBytes == nil:
		o.noPeak.Add(ctx, 1, templateAttrs(tmpl, attribute.String(attrPeakMissing, "absent")))
	case e.GetMemoryPeakIsLowerBound():
		o.noPeak.Add(ctx, 1, templateAttrs(tmpl, attribute.String(attrPeakMissing, "lower-bound")))
	default:
		o.actPeak.Record(ctx, clampInt64(e.GetMemoryPeakBytes()), templateAttrs(tmpl))
	}
	o.actDuration.Record(ctx, time.Duration(e.GetEndUnixNano()-e.GetEpochUnixNano()).Seconds(), templateAttrs(tmpl))
}

// eventText is foreign text as an event carries it: cut as labels are,
// valid UTF-8 (protobuf refuses a whole export over one bad string), and a
// copy of its own, so a queued event does not keep a daemon's whole answer
// alive.
func eventText(s string) string {
	return strings.Clone(strings.ToValidUTF8(cut(s), "\uFFFD"))
}

// identityAttrs are an event's workload attributes: the actor always (an
// event is one activation's), cut as labels are.
func identityAttrs(actorUID, actorName, actorNamespace, tmplNamespace, tmplName string, class sandboxstatsv1.SandboxClass,
	src sandboxstatsv1.StatsSource, epoch int64, kind, socket string) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String(attrKind, kind),
		attribute.String(attrActorUID, eventText(actorUID)),
		attribute.String(attrClass, classLabel(class)), attribute.String(attrSource, sourceLabel(src)),
		attribute.Int64(attrEpoch, epoch),
		attribute.String(attrDaemon, eventText(socket)),
	}
	for _, a := range []struct{ k, v string }{{attrActorName, actorName}, {attrActorNamespace, actorNamespace},
		{attrTemplateNamespace, tmplNamespace}, {attrTemplateName, tmplName}} {
		if a.v != "" {
			kv = append(kv, attribute.String(a.k, eventText(a.v)))
		}
	}
	return kv
}

// sampleEvent emits an initial or periodic event of s.
func (o *otelMetrics) sampleEvent(kind, socket string, s *sandboxstatsv1.WorkloadStatsSample, now time.Time) {
	if o.logger == nil {
		return
	}
	kv := identityAttrs(s.GetActorUid(), s.GetActorName(), s.GetActorNamespace(), s.GetTemplateNamespace(), s.GetTemplateName(),
		s.GetSandboxClass(), s.GetSource(), s.GetEpochUnixNano(), kind, socket)
	kv = append(kv,
		attribute.Int64(attrMemUsage, clampInt64(s.GetMemoryCurrentBytes())),
		attribute.Int64(attrMemWorkingSet, clampInt64(s.GetMemoryWorkingSetBytes())),
		attribute.Int64(attrObservedAt, s.GetObservedAtUnixNano()))
	if s.MemoryPeakBytes != nil {
		kv = append(kv, attribute.Int64(attrMemPeak, clampInt64(s.GetMemoryPeakBytes())))
	}
	if usec, ok := rate.OwnCPU(s); ok {
		kv = append(kv, attribute.Float64(attrCPUTime, float64(usec)/1e6))
	}
	o.emit(time.Unix(0, s.GetObservedAtUnixNano()), now, kv)
}

// finalEvent emits the final event of e, which charged charged µs (how).
func (o *otelMetrics) finalEvent(socket string, e *sandboxstatsv1.EndedActivation, charged uint64, how rate.EndEvent, now time.Time) {
	if o.logger == nil {
		return
	}
	id := e.GetIdentity()
	kv := identityAttrs(id.GetActorUid(), id.GetActorName(), id.GetActorNamespace(), id.GetTemplateNamespace(), id.GetTemplateName(),
		e.GetSandboxClass(), e.GetSource(), e.GetEpochUnixNano(), KindFinal, socket)
	kv = append(kv,
		attribute.Int64(attrEnd, e.GetEndUnixNano()),
		attribute.Float64(attrDuration, time.Duration(e.GetEndUnixNano()-e.GetEpochUnixNano()).Seconds()),
		attribute.String(attrOutcome, api.OutcomeName(e.GetOutcome())),
		attribute.String(attrProvenance, api.ProvenanceName(e.GetFinalProvenance())),
		attribute.Float64(attrCharged, float64(charged)/1e6),
		attribute.String(attrCharge, string(how)))
	if a := e.GetFinalAgeNanos(); a != 0 {
		kv = append(kv, attribute.Float64(attrFinalAge, time.Duration(a).Seconds()))
	}
	if r := e.GetFinalReason(); r != "" {
		kv = append(kv, attribute.String(attrFinalReason, eventText(r)))
	}
	if e.CpuUsec != nil {
		kv = append(kv, attribute.Float64(attrCPUTime, float64(e.GetCpuUsec())/1e6))
	}
	if e.MemoryPeakBytes != nil {
		kv = append(kv, attribute.Int64(attrMemPeak, clampInt64(e.GetMemoryPeakBytes())))
		if e.GetMemoryPeakIsLowerBound() {
			kv = append(kv, attribute.Bool(attrMemPeakLower, true))
		}
	}
	if f := e.GetFinal(); f != nil {
		kv = append(kv, attribute.Int64(attrMemUsage, clampInt64(f.GetMemoryCurrentBytes())),
			attribute.Int64(attrMemWorkingSet, clampInt64(f.GetMemoryWorkingSetBytes())))
	}
	if d := e.GetBaselineDelayNanos(); d != 0 {
		kv = append(kv, attribute.Float64(attrBaselineDelay, time.Duration(d).Seconds()))
	}
	o.emit(time.Unix(0, e.GetEndUnixNano()), now, kv)
}

func (o *otelMetrics) emit(at, now time.Time, kv []attribute.KeyValue) {
	var r otellog.Record
	r.SetEventName(EventUsageSampled)
	r.SetTimestamp(at)
	r.SetObservedTimestamp(now)
	r.SetSeverity(otellog.SeverityInfo)
	r.SetSeverityText("INFO")
	r.AddAttributes(kv...)
	o.logger.Emit(context.Background(), r)
}

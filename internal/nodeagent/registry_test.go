package nodeagent

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/telemetry"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// registryPath is the registry, from this package's directory.
const registryPath = "../../docs/telemetry/registry.yaml"

// recordingProcessor keeps every log record emitted: the events a test
// reads back, as a collector would get them.
type recordingProcessor struct {
	mu   sync.Mutex
	recs []sdklog.Record
}

func (p *recordingProcessor) OnEmit(_ context.Context, r *sdklog.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recs = append(p.recs, r.Clone())
	return nil
}
func (p *recordingProcessor) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (p *recordingProcessor) Shutdown(context.Context) error                         { return nil }
func (p *recordingProcessor) ForceFlush(context.Context) error                       { return nil }

func (p *recordingProcessor) records() []sdklog.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.recs)
}

// otelHarness is metrics with an OTel export read in memory.
type otelHarness struct {
	m      *metrics
	reg    *prometheus.Registry
	reader *sdkmetric.ManualReader
	events *recordingProcessor
}

func newOTelHarness(t *testing.T, cfg metricsConfig, periodicEvery int) *otelHarness {
	t.Helper()
	dists := NewDistributions()
	h := &otelHarness{reg: prometheus.NewPedanticRegistry(), reader: sdkmetric.NewManualReader(sdkmetric.WithProducer(dists)), events: &recordingProcessor{}}
	cfg.OTel = &OTel{
		// As internal/otlp's pipeline makes it for statsagent.
		Meters:        sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader), sdkmetric.WithCardinalityLimit(OTelPipelineCardinalityLimit(cfg.MaxTemplates, cfg.MaxContainers))),
		Loggers:       sdklog.NewLoggerProvider(sdklog.WithProcessor(h.events)),
		PeriodicEvery: periodicEvery,
		Distributions: dists,
	}
	m, err := newMetrics(h.reg, cfg, discard())
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	return h
}

func (h *otelHarness) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// everySignalSample is signalSample with every counter the Accountant
// charges set, so that every metric has a point.
func everySignalSample(actor string, epoch, at time.Time, v uint64) *sandboxstatsv1.WorkloadStatsSample {
	s := signalSample(actor, epoch, at, v)
	stall := func() *sandboxstatsv1.PressureStall {
		return &sandboxstatsv1.PressureStall{SomeUsec: proto.Uint64(v / 4), FullUsec: proto.Uint64(v / 8)}
	}
	s.Pressure = &sandboxstatsv1.Pressure{Cpu: stall(), Memory: stall(), Io: stall()}
	t := s.Network.Total
	t.RxErrors, t.TxErrors, t.RxDropped, t.TxDropped = v/10000, v/20000, v/10000, v/20000
	s.BlockIo.ReadBytes, s.BlockIo.ReadIos = 32*v, v/4000
	s.SandboxOwnCpuUsec = proto.Uint64(v / 5)
	return s
}

// richSweeps applies sweeps in which every metric and every kind of event
// has a point: two workloads sampled twice, one ended with a read at the
// end, one never sampled and ended without a peak, one with a lower-bound
// peak; a drift finding; a failed poll; an actor two daemons report; a
// second template (folded with MaxTemplates 1); two ended records dropped
// before they were read (a lost event).
func richSweeps(h *otelHarness, t0 time.Time) {
	epoch := t0.Add(10 * time.Second)
	w1 := func(at time.Time, v uint64) *sandboxstatsv1.WorkloadStatsSample {
		s := everySignalSample("w1", epoch, at, v)
		s.WorkerPool = "pool-a"
		// Three containers, one past MaxContainers 2 (folded).
		s.Containers = []*sandboxstatsv1.ContainerStats{ctr("a", "app", v/2000, 100, 3), ctr("b", "", v/4000, 10, 1), ctr("c", "idle", v/8000, 1, 1)}
		return s
	}
	w2 := everySignalSample("w2", epoch, t0.Add(20*time.Second), 1_000_000)
	w2.SandboxClass, w2.Source = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
	w2.Containers = []*sandboxstatsv1.ContainerStats{ctr("j", "jvm", 900, 200, 9)}
	w2.TemplateName = "java" // folded into (other) with MaxTemplates 1: w1's python holds the slot
	first := okResult("/run/statsd/a.sock", w1(t0.Add(20*time.Second), 4_000_000), w2)
	first.DriftFindings = []*sandboxstatsv1.DriftFinding{{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, Subject: "/pod", ActorUid: "w1"}}
	first.EndedLog = &sandboxstatsv1.EndedLog{InstanceId: "i1", LowestSequence: 1, NextSequence: 1}
	dup := everySignalSample("dup", epoch, t0.Add(20*time.Second), 1)
	h.m.Apply([]sweep.DaemonResult{first,
		okResult("/run/statsd/b.sock", dup), okResult("/run/statsd/c.sock", proto.Clone(dup).(*sandboxstatsv1.WorkloadStatsSample)),
		{Socket: "/run/statsd/d.sock", Status: sweep.StatusError, Code: codes.Unavailable, Capped: []string{"samples"}, PeerRefused: true},
	}, t0.Add(20*time.Second), time.Millisecond)

	end := t0.Add(70 * time.Second)
	ended := endedOf(w1(end, 9_000_000), end, 9_000_000)
	unseen := endedOf(everySignalSample("w3", epoch, end, 2_000_000), end, 2_000_000)
	unseen.MemoryPeakBytes, unseen.FinalProvenance, unseen.FinalReason, unseen.FinalAgeNanos = nil,
		sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL, "read timed out", int64(5*time.Second)
	lower := endedOf(everySignalSample("w4", epoch, end, 1_000_000), end, 1_000_000)
	lower.MemoryPeakIsLowerBound, lower.Outcome, lower.BaselineDelayNanos = true, sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_SANDBOX_DEAD, int64(time.Second)
	second := okResult("/run/statsd/a.sock", w2)
	second.Ended = []*sandboxstatsv1.EndedActivation{ended, unseen, lower}
	for i, e := range second.Ended { // 1 and 2 were dropped before this sweep
		e.InstanceId, e.Sequence = "i1", uint64(3+i)
	}
	second.EndedLog = &sandboxstatsv1.EndedLog{InstanceId: "i1", LowestSequence: 3, NextSequence: 6}
	second.DriftFindings = first.DriftFindings
	h.m.Apply([]sweep.DaemonResult{second}, t0.Add(80*time.Second), time.Millisecond)
}

// instrumentOf names a collected metric's instrument as the registry does.
func instrumentOf(m metricdata.Metrics) (instrument string, points []attribute.Set) {
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			points = append(points, p.Attributes)
		}
		return sumInstrument(d.IsMonotonic, d.Temporality), points
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			points = append(points, p.Attributes)
		}
		return sumInstrument(d.IsMonotonic, d.Temporality), points
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			points = append(points, p.Attributes)
		}
		return "gauge", points
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			points = append(points, p.Attributes)
		}
		return "histogram", points
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			points = append(points, p.Attributes)
		}
		return "histogram", points
	}
	return fmt.Sprintf("%T", m.Data), nil
}

func sumInstrument(monotonic bool, temporality metricdata.Temporality) string {
	switch {
	case temporality != metricdata.CumulativeTemporality:
		return "non-cumulative sum"
	case monotonic:
		return "counter"
	}
	return "updowncounter"
}

// checkKeys reports the keys of set not in required or optional, and the
// required ones it lacks.
func checkKeys(where string, keys, required, optional []string) []string {
	var errs []string
	for _, k := range keys {
		if !slices.Contains(required, k) && !slices.Contains(optional, k) {
			errs = append(errs, fmt.Sprintf("%s: attribute %q is not in the registry", where, k))
		}
	}
	for _, k := range required {
		if !slices.Contains(keys, k) {
			errs = append(errs, fmt.Sprintf("%s: required attribute %q missing", where, k))
		}
	}
	return errs
}

func setKeys(s attribute.Set) []string {
	var keys []string
	for _, kv := range s.ToSlice() {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// valueType names an attribute value's type as the registry does.
func valueType(v attribute.Value) string {
	switch v.Type() {
	case attribute.STRING:
		return "string"
	case attribute.INT64:
		return "int"
	case attribute.FLOAT64:
		return "double"
	case attribute.BOOL:
		return "bool"
	}
	return v.Type().String()
}

// TestRegistry: what the agent emits, over OTLP (metrics and events) and
// Prometheus, is what docs/telemetry/registry.yaml lists, no more, no
// less: every metric's instrument, unit and attribute keys, every event's
// name, kinds and typed attributes, every Prometheus name.
func TestRegistry(t *testing.T) {
	reg, err := telemetry.Load(registryPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, labelActor := range []bool{false, true} {
		t.Run(fmt.Sprintf("label-actor=%v", labelActor), func(t *testing.T) {
			t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
			// With a state directory: its saves are counted too.
			h := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2, LabelActor: labelActor, MaxTemplates: 1,
				MaxContainers: 2, CAdvisorCompat: true, LabelWorkerPool: labelActor, State: newStateStore(t.TempDir(), discard())}, 1)
			richSweeps(h, t0)
			rm := h.collect(t)
			var errs []string
			emitted := map[string]bool{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					emitted[m.Name] = true
					want, ok := reg.Metric(m.Name)
					if !ok {
						errs = append(errs, fmt.Sprintf("metric %q emitted, not in the registry", m.Name))
						continue
					}
					inst, points := instrumentOf(m)
					if inst != want.Instrument || m.Unit != want.Unit {
						errs = append(errs, fmt.Sprintf("%s: %s in %q, the registry says %s in %q", m.Name, inst, m.Unit, want.Instrument, want.Unit))
					}
					if len(points) == 0 {
						errs = append(errs, fmt.Sprintf("%s: no points", m.Name))
					}
					for _, p := range points {
						keys := setKeys(p)
						if labelActor && slices.Contains(want.Optional, attrActorUID) && !slices.Contains(keys, attrActorUID) && m.Name != "sandboxstats.drift.open_findings" {
							errs = append(errs, fmt.Sprintf("%s: no actor attributes with LabelActor", m.Name))
						}
						errs = append(errs, checkKeys(m.Name, keys, want.Attributes, want.Optional)...)
					}
				}
			}
			for _, m := range reg.Metrics {
				if !emitted[m.Name] {
					errs = append(errs, fmt.Sprintf("registry metric %q never emitted", m.Name))
				}
			}
			errs = append(errs, checkValues(t, reg, rm, h.reg)...)
			errs = append(errs, checkEvents(reg, h.events.records())...)
			errs = append(errs, checkPrometheus(t, reg, h.reg)...)
			slices.Sort(errs)
			for _, e := range slices.Compact(errs) {
				t.Error(e)
			}
		})
	}
}

// discriminators are the attributes that tell the Prometheus names one
// OTLP metric maps to apart: a Prometheus name holds the value, as
// _receive_ or _cpu_.
var discriminators = []string{attrNetDirection, attrDiskDirection, attrPSIResource}

// otlpSums sums a metric's points (a histogram's sums) by the value of its
// discriminating attribute ("" when it has none).
func otlpSums(m metricdata.Metrics) map[string]float64 {
	out := map[string]float64{}
	add := func(set attribute.Set, v float64) {
		key := ""
		for _, d := range discriminators {
			if dv, ok := set.Value(attribute.Key(d)); ok {
				key = dv.AsString()
			}
		}
		out[key] += v
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Value))
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Value))
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Sum)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Sum))
		}
	}
	return out
}

// checkValues holds every OTLP metric's values to the Prometheus metrics
// the registry maps it to: each Prometheus name's series summed equals the
// OTLP points with the matching attribute value summed (a swap of names,
// directions or PSI scopes shows).
func checkValues(t *testing.T, reg *telemetry.Registry, rm metricdata.ResourceMetrics, g prometheus.Gatherer) []string {
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	prom := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			prom[f.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetHistogram().GetSampleSum()
		}
	}
	var errs []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			want, ok := reg.Metric(m.Name)
			if !ok {
				continue
			}
			sums := otlpSums(m)
			for _, name := range want.Prometheus {
				key := ""
				if len(want.Prometheus) > 1 {
					for v := range sums {
						if v != "" && strings.Contains(name, "_"+v+"_") {
							key = v
						}
					}
				}
				got, pv := sums[key], prom[name]
				if math.Abs(got-pv) > 1e-9*math.Max(1, math.Abs(pv)) {
					errs = append(errs, fmt.Sprintf("%s{%s} sums to %v, its Prometheus %s to %v", m.Name, key, got, name, pv))
				}
			}
		}
	}
	return errs
}

// checkEvents holds every record to the registry's events.
func checkEvents(reg *telemetry.Registry, recs []sdklog.Record) []string {
	var errs []string
	kinds := map[string]bool{}
	for _, r := range recs {
		i := slices.IndexFunc(reg.Events, func(e telemetry.Event) bool { return e.Name == r.EventName() })
		if i < 0 {
			errs = append(errs, fmt.Sprintf("event %q emitted, not in the registry", r.EventName()))
			continue
		}
		e := reg.Events[i]
		var keys []string
		kind := ""
		r.WalkAttributes(func(kv attribute.KeyValue) bool {
			keys = append(keys, string(kv.Key))
			if kv.Key == attrKind {
				kind = kv.Value.AsString()
			}
			if a, ok := reg.Attributes[string(kv.Key)]; ok && a.Type != valueType(kv.Value) {
				errs = append(errs, fmt.Sprintf("%s: attribute %s is %s, the registry says %s", e.Name, kv.Key, valueType(kv.Value), a.Type))
			}
			return true
		})
		k, ok := e.Kinds[kind]
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: kind %q not in the registry", e.Name, kind))
			continue
		}
		kinds[kind] = true
		errs = append(errs, checkKeys(e.Name+" "+kind, keys, append(slices.Clone(e.Attributes), k.Required...), append(slices.Clone(e.Optional), k.Optional...))...)
	}
	for _, e := range reg.Events {
		for k := range e.Kinds {
			if !kinds[k] {
				errs = append(errs, fmt.Sprintf("event %s kind %q never emitted", e.Name, k))
			}
		}
	}
	return errs
}

// checkPrometheus holds the agent's Prometheus names to the registry's
// (those of the OTLP pipeline are internal/otlp's to check).
func checkPrometheus(t *testing.T, reg *telemetry.Registry, g prometheus.Gatherer) []string {
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
		if !slices.Contains(reg.PrometheusNames(), f.GetName()) {
			errs = append(errs, fmt.Sprintf("Prometheus metric %q emitted, not in the registry", f.GetName()))
		}
	}
	for _, n := range reg.PrometheusNames() {
		// The OTLP pipeline's metrics are internal/otlp's to check, the
		// metrics server's and discovery's cmd/statsagent's
		// (TestAgentAgainstFakes checks every metric the binary serves): the
		// harness runs neither.
		if !names[n] && !strings.HasPrefix(n, "sandboxstats_agent_otlp_") && !strings.HasPrefix(n, "sandboxstats_agent_http_") &&
			n != metricDiscoveryFailures {
			errs = append(errs, fmt.Sprintf("registry Prometheus metric %q never emitted", n))
		}
	}
	return errs
}

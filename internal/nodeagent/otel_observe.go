package nodeagent

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// labelAttrs are one label set's measurement options, made once while the
// label set is in the snapshots: its attributes alone, and with each extra
// attribute (a drift kind, an ended activation counter's own).
type labelAttrs struct {
	base  metric.MeasurementOption
	set   attribute.Set
	extra map[extraKey]metric.MeasurementOption
}

// extraKey names one list of extra attributes: a drift kind, or an ended
// activation counter's own.
type extraKey struct {
	kind  string
	attr  attribute.Key // an ended activation's: its outcome, provenance or missing peak
	value string
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

// labels returns l's options (from kept, those of the last collection),
// kept in seen for the next collection.
func labels(l labelSet, withActor bool, kept, seen map[labelSet]*labelAttrs) *labelAttrs {
	if la, ok := seen[l]; ok {
		return la
	}
	la, ok := kept[l]
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
	if l.withPool {
		kv = append(kv, attribute.String(attrWorkerPool, l.workerPool))
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
		la := labels(l, withActor, o.attrs, seen)
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
	for k, n := range snap.drift {
		la := labels(k.labels, withActor, o.attrs, seen)
		obs.ObserveInt64(o.drift, int64(n), la.with(extraKey{kind: k.kind}, func() []attribute.KeyValue {
			return []attribute.KeyValue{attribute.String(attrDriftKind, k.kind)}
		}))
	}
	if snap.daemons != nil {
		for _, st := range []sweep.Status{sweep.StatusOK, sweep.StatusNoSample, sweep.StatusVanished, sweep.StatusError, sweep.StatusSkipped} {
			obs.ObserveInt64(o.daemons, int64(snap.daemons[st]), metric.WithAttributes(attribute.String(attrResult, string(st))))
		}
	}
	tmplSeen := make(map[labelSet]*labelAttrs, len(o.tmplAttrs))
	for l, ac := range snap.activations {
		la := labels(l, false, o.tmplAttrs, tmplSeen)
		for _, c := range []struct {
			inst   metric.Int64ObservableCounter
			key    attribute.Key
			counts map[string]int64
		}{{o.ended, attrOutcome, ac.ended}, {o.finals, attrProvenance, ac.finals}, {o.noPeak, attrPeakMissing, ac.noPeak}} {
			for v, n := range c.counts {
				obs.ObserveInt64(c.inst, n, la.with(extraKey{attr: c.key, value: v}, func() []attribute.KeyValue {
					return []attribute.KeyValue{attribute.String(string(c.key), v)}
				}))
			}
		}
	}
	// Forget the label sets no longer in the snapshot.
	o.attrs, o.tmplAttrs = seen, tmplSeen
}

// clampInt64 is v as an int64, the largest int64 above it (a hostile
// daemon's sums saturate at the largest uint64).
func clampInt64(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}

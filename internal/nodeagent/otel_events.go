package nodeagent

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

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
	src sandboxstatsv1.StatsSource, epoch int64, kind, uid, socket string) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String(attrKind, kind),
		attribute.String(attrRecordUID, uid),
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
		s.GetSandboxClass(), s.GetSource(), s.GetEpochUnixNano(), kind, sampleUID(kind, s), socket)
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
		e.GetSandboxClass(), e.GetSource(), e.GetEpochUnixNano(), KindFinal, finalUID(e), socket)
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
	if in := e.GetInstanceId(); in != "" {
		kv = append(kv, attribute.String(attrInstance, eventText(in)), attribute.Int64(attrSequence, clampInt64(e.GetSequence())))
	}
	o.emit(time.Unix(0, e.GetEndUnixNano()), now, kv)
}

// lostEvent emits the lost event of a gap: the records from to to of
// socket's statsd instance were dropped before this agent read them.
func (o *otelMetrics) lostEvent(socket, instance string, from, to uint64, now time.Time) {
	o.endedLost.Add(context.Background(), clampInt64(to-from+1))
	if o.logger == nil {
		return
	}
	o.emit(now, now, []attribute.KeyValue{
		attribute.String(attrKind, KindLost),
		attribute.String(attrRecordUID, lostUID(instance, from, to)),
		attribute.String(attrDaemon, eventText(socket)),
		attribute.String(attrInstance, eventText(instance)),
		attribute.Int64(attrLostRecords, clampInt64(to-from+1)),
		attribute.Int64(attrLostFrom, clampInt64(from)),
		attribute.Int64(attrLostTo, clampInt64(to)),
	})
}

// emit emits one usage event. With --state-dir an initial, final or lost
// event is kept pending (in the state file) until the pipeline settles it,
// so that a restart sends it again.
func (o *otelMetrics) emit(at, now time.Time, kv []attribute.KeyValue) {
	if o.pending != nil {
		var uid, kind string
		for _, a := range kv {
			switch a.Key {
			case attrRecordUID:
				uid = a.Value.AsString()
			case attrKind:
				kind = a.Value.AsString()
			}
		}
		if uid != "" && kind != KindPeriodic {
			o.pending.add(pendingEvent{UID: uid, TimeUnixNano: at.UnixNano(), Attrs: storedAttrs(kv)})
		}
	}
	var r otellog.Record
	r.SetEventName(EventUsageSampled)
	r.SetTimestamp(at)
	r.SetObservedTimestamp(now)
	r.SetSeverity(otellog.SeverityInfo)
	r.SetSeverityText("INFO")
	r.AddAttributes(kv...)
	o.logger.Emit(context.Background(), r)
}

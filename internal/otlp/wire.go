package otlp

// This file encodes a collection as an OTLP ExportMetricsServiceRequest
// straight onto the wire (protowire), the bytes the SDK's exporters send
// after building one OTLP message per data point, attribute and value:
// that transform and its marshalling were two thirds of a 1000-workload
// export's CPU and allocated 27 MB a sweep (BenchmarkExport1000, issue 33).
// The fields and their presence are the SDK's transform's
// (otlpmetric*/internal/transform); wire_test.go decodes both and compares,
// and wire_fuzz_test.go does for random collections. One difference: a
// string that is not UTF-8 is sent with U+FFFD (validUTF8), where the SDK
// failed the export.

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of opentelemetry/proto (collector/metrics/v1, metrics/v1,
// common/v1, resource/v1).
const (
	fRequestResourceMetrics = 1 // ExportMetricsServiceRequest.resource_metrics

	fResourceMetricsResource = 1
	fResourceMetricsScope    = 2
	fResourceMetricsSchema   = 3
	fResourceAttributes      = 1

	fScopeMetricsScope   = 1
	fScopeMetricsMetrics = 2
	fScopeMetricsSchema  = 3
	fScopeName           = 1
	fScopeVersion        = 2
	fScopeAttributes     = 3

	fMetricName        = 1
	fMetricDescription = 2
	fMetricUnit        = 3
	fMetricGauge       = 5
	fMetricSum         = 7
	fMetricHistogram   = 9

	fDataPoints      = 1 // Gauge, Sum, Histogram
	fTemporality     = 2 // Sum, Histogram
	fSumIsMonotonic  = 3
	fNumberStart     = 2
	fNumberTime      = 3
	fNumberAsDouble  = 4
	fNumberExemplars = 5
	fNumberAsInt     = 6
	fNumberAttrs     = 7
	fHistStart       = 2
	fHistTime        = 3
	fHistCount       = 4
	fHistSum         = 5
	fHistBuckets     = 6
	fHistBounds      = 7
	fHistExemplars   = 8
	fHistAttrs       = 9
	fHistMin         = 11
	fHistMax         = 12

	fExemplarTime    = 2
	fExemplarDouble  = 3
	fExemplarSpanID  = 4
	fExemplarTraceID = 5
	fExemplarInt     = 6
	fExemplarAttrs   = 7

	fKeyValueKey   = 1
	fKeyValueValue = 2
	fAnyString     = 1
	fAnyBool       = 2
	fAnyInt        = 3
	fAnyDouble     = 4
	fAnyArray      = 5
	fAnyKvlist     = 6
	fAnyBytes      = 7
	fListValues    = 1 // ArrayValue.values, KeyValueList.values

	temporalityDelta      = 1
	temporalityCumulative = 2
)

// wireEncodable reports whether appendMetricsRequest encodes every metric
// of rm (gauges, sums and explicit-bucket histograms with a known
// temporality); the rest goes through the SDK's exporter.
func wireEncodable(rm *metricdata.ResourceMetrics) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var t metricdata.Temporality
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64], metricdata.Gauge[float64]:
				continue
			case metricdata.Sum[int64]:
				t = d.Temporality
			case metricdata.Sum[float64]:
				t = d.Temporality
			case metricdata.Histogram[int64]:
				t = d.Temporality
			case metricdata.Histogram[float64]:
				t = d.Temporality
			default:
				return false
			}
			if temporality(t) == 0 {
				return false
			}
		}
	}
	return true
}

// appendMetricsRequest appends rm as an ExportMetricsServiceRequest. Call
// it only when wireEncodable(rm).
func appendMetricsRequest(b []byte, rm *metricdata.ResourceMetrics) []byte {
	b, rmAt := beginMessage(b, fRequestResourceMetrics)
	b, resAt := beginMessage(b, fResourceMetricsResource)
	b = appendSet(b, fResourceAttributes, *rm.Resource.Set())
	b = endMessage(b, resAt)
	for i := range rm.ScopeMetrics {
		b = appendScopeMetrics(b, &rm.ScopeMetrics[i])
	}
	b = appendString(b, fResourceMetricsSchema, rm.Resource.SchemaURL())
	return endMessage(b, rmAt)
}

func appendScopeMetrics(b []byte, sm *metricdata.ScopeMetrics) []byte {
	b, at := beginMessage(b, fResourceMetricsScope)
	b = appendScope(b, sm.Scope)
	for i := range sm.Metrics {
		b = appendMetric(b, &sm.Metrics[i])
	}
	b = appendString(b, fScopeMetricsSchema, sm.Scope.SchemaURL)
	return endMessage(b, at)
}

func appendScope(b []byte, s instrumentation.Scope) []byte {
	b, at := beginMessage(b, fScopeMetricsScope)
	b = appendString(b, fScopeName, s.Name)
	b = appendString(b, fScopeVersion, s.Version)
	b = appendSet(b, fScopeAttributes, s.Attributes)
	return endMessage(b, at)
}

func appendMetric(b []byte, m *metricdata.Metrics) []byte {
	b, at := beginMessage(b, fScopeMetricsMetrics)
	b = appendString(b, fMetricName, m.Name)
	b = appendString(b, fMetricDescription, m.Description)
	b = appendString(b, fMetricUnit, m.Unit)
	switch d := m.Data.(type) {
	case metricdata.Gauge[int64]:
		b = appendNumbers(b, fMetricGauge, d.DataPoints, 0, false)
	case metricdata.Gauge[float64]:
		b = appendNumbers(b, fMetricGauge, d.DataPoints, 0, false)
	case metricdata.Sum[int64]:
		b = appendNumbers(b, fMetricSum, d.DataPoints, temporality(d.Temporality), d.IsMonotonic)
	case metricdata.Sum[float64]:
		b = appendNumbers(b, fMetricSum, d.DataPoints, temporality(d.Temporality), d.IsMonotonic)
	case metricdata.Histogram[int64]:
		b = appendHistogram(b, d.DataPoints, temporality(d.Temporality))
	case metricdata.Histogram[float64]:
		b = appendHistogram(b, d.DataPoints, temporality(d.Temporality))
	default:
		panic(fmt.Sprintf("otlp: appendMetric of %T (wireEncodable refuses it)", d))
	}
	return endMessage(b, at)
}

// appendNumbers appends a Gauge (temp 0) or a Sum of points.
func appendNumbers[N int64 | float64](b []byte, field protowire.Number, pts []metricdata.DataPoint[N], temp uint64, monotonic bool) []byte {
	b, at := beginMessage(b, field)
	for i := range pts {
		p := &pts[i]
		var pAt int
		b, pAt = beginMessage(b, fDataPoints)
		b = appendFixed64(b, fNumberStart, unixNano(p.StartTime))
		b = appendFixed64(b, fNumberTime, unixNano(p.Time))
		b = appendNumber(b, fNumberAsInt, fNumberAsDouble, p.Value)
		b = appendExemplars(b, fNumberExemplars, p.Exemplars)
		b = appendSet(b, fNumberAttrs, p.Attributes)
		b = endMessage(b, pAt)
	}
	if temp != 0 {
		b = appendVarint(b, fTemporality, temp)
	}
	if monotonic {
		b = appendVarint(b, fSumIsMonotonic, 1)
	}
	return endMessage(b, at)
}

func appendHistogram[N int64 | float64](b []byte, pts []metricdata.HistogramDataPoint[N], temp uint64) []byte {
	b, at := beginMessage(b, fMetricHistogram)
	for i := range pts {
		p := &pts[i]
		var pAt int
		b, pAt = beginMessage(b, fDataPoints)
		b = appendFixed64(b, fHistStart, unixNano(p.StartTime))
		b = appendFixed64(b, fHistTime, unixNano(p.Time))
		b = appendFixed64(b, fHistCount, p.Count)
		b = protowire.AppendTag(b, fHistSum, protowire.Fixed64Type) // optional: always set, as the SDK does
		b = protowire.AppendFixed64(b, math.Float64bits(float64(p.Sum)))
		if len(p.BucketCounts) > 0 {
			b = protowire.AppendTag(b, fHistBuckets, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(8*len(p.BucketCounts)))
			for _, c := range p.BucketCounts {
				b = protowire.AppendFixed64(b, c)
			}
		}
		if len(p.Bounds) > 0 {
			b = protowire.AppendTag(b, fHistBounds, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(8*len(p.Bounds)))
			for _, v := range p.Bounds {
				b = protowire.AppendFixed64(b, math.Float64bits(v))
			}
		}
		b = appendExemplars(b, fHistExemplars, p.Exemplars)
		b = appendSet(b, fHistAttrs, p.Attributes)
		if v, ok := p.Min.Value(); ok {
			b = protowire.AppendTag(b, fHistMin, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, math.Float64bits(float64(v)))
		}
		if v, ok := p.Max.Value(); ok {
			b = protowire.AppendTag(b, fHistMax, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, math.Float64bits(float64(v)))
		}
		b = endMessage(b, pAt)
	}
	b = appendVarint(b, fTemporality, temp)
	return endMessage(b, at)
}

func appendExemplars[N int64 | float64](b []byte, field protowire.Number, es []metricdata.Exemplar[N]) []byte {
	for i := range es {
		e := &es[i]
		var at int
		b, at = beginMessage(b, field)
		b = appendFixed64(b, fExemplarTime, unixNano(e.Time))
		b = appendNumber(b, fExemplarInt, fExemplarDouble, e.Value)
		b = appendBytes(b, fExemplarSpanID, e.SpanID)
		b = appendBytes(b, fExemplarTraceID, e.TraceID)
		for _, kv := range e.FilteredAttributes {
			b = appendKeyValue(b, fExemplarAttrs, kv)
		}
		b = endMessage(b, at)
	}
	return b
}

// appendNumber appends v as the oneof member of its type (always, zero
// included: a oneof member is present).
func appendNumber[N int64 | float64](b []byte, intField, doubleField protowire.Number, v N) []byte {
	switch v := any(v).(type) {
	case int64:
		b = protowire.AppendTag(b, intField, protowire.Fixed64Type) // sfixed64
		return protowire.AppendFixed64(b, uint64(v))
	case float64:
		b = protowire.AppendTag(b, doubleField, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v))
	}
	return b
}

// appendSet appends each attribute of set as a KeyValue of field.
func appendSet(b []byte, field protowire.Number, set attribute.Set) []byte {
	for iter := set.Iter(); iter.Next(); {
		b = appendKeyValue(b, field, iter.Attribute())
	}
	return b
}

func appendKeyValue(b []byte, field protowire.Number, kv attribute.KeyValue) []byte {
	b, at := beginMessage(b, field)
	b = appendString(b, fKeyValueKey, string(kv.Key))
	b = appendAnyValue(b, fKeyValueValue, kv.Value)
	return endMessage(b, at)
}

// appendAnyValue appends v as the SDK's transform.Value converts it.
func appendAnyValue(b []byte, field protowire.Number, v attribute.Value) []byte {
	b, at := beginMessage(b, field)
	switch v.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, fAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, fAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, validUTF8(v.AsString()))
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, fAnyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b = appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		b = appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		b = appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		b = appendArray(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		b = appendArray(b, v.AsSlice(), func(v attribute.Value) attribute.Value { return v })
	case attribute.MAP:
		var mAt int
		b, mAt = beginMessage(b, fAnyKvlist)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, fListValues, kv)
		}
		b = endMessage(b, mAt)
	case attribute.EMPTY:
	default:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return endMessage(b, at)
}

func appendArray[T any](b []byte, vs []T, value func(T) attribute.Value) []byte {
	b, at := beginMessage(b, fAnyArray)
	for _, v := range vs {
		b = appendAnyValue(b, fListValues, value(v))
	}
	return endMessage(b, at)
}

// beginMessage appends field's tag and one byte for the length of the
// message that follows; endMessage writes the length (widening it when
// the message is 128 bytes or more).
func beginMessage(b []byte, field protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = append(b, 0)
	return b, len(b)
}

func endMessage(b []byte, start int) []byte {
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	extra := protowire.SizeVarint(uint64(n)) - 1
	for range extra {
		b = append(b, 0)
	}
	copy(b[start+extra:], b[start:start+n])
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}

// appendString, appendBytes, appendVarint and appendFixed64 leave a zero
// value out, as proto3 does for a field without presence.
func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, validUTF8(s))
}

// validUTF8 is s with each invalid UTF-8 sequence replaced by U+FFFD: a
// proto3 string must be UTF-8. Every string the encoder writes passes here
// (names, units, descriptions, scopes, schema URLs, keys, values); the
// resource's come from the host (os.Hostname, --node-name, $NODE_NAME).
// The SDK's exporter refused the whole export instead (protobuf-go's
// Marshal); opentelemetry-proto#845 asks a sender for U+FFFD.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func appendBytes(b []byte, field protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, field protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFixed64(b []byte, field protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

// temporality is t's OTLP number, 0 for one OTLP has not.
func temporality(t metricdata.Temporality) uint64 {
	switch t {
	case metricdata.DeltaTemporality:
		return temporalityDelta
	case metricdata.CumulativeTemporality:
		return temporalityCumulative
	}
	return 0
}

// unixNano is t in ns since the epoch, 0 before it (the zero time).
func unixNano(t time.Time) uint64 {
	return uint64(max(0, t.UnixNano()))
}

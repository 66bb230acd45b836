package testenv

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// CollectedPoint is one metric data point as the collector received it.
type CollectedPoint struct {
	Metric      string // the metric's name
	Description string
	Unit        string // UCUM, e.g. "s", "By", "{cpu}"
	Type        string // "sum", "gauge", "histogram", "exponential_histogram" or "summary"
	Temporality string // "cumulative" or "delta"; "" for gauges and summaries
	Monotonic   bool   // sums only

	Attributes map[string]string // the data point's, values as strings (see attrString)
	Resource   map[string]string // the resource's attributes, likewise
	Scope      string            // the instrumentation scope's name

	// Value is a sum's or gauge's value (asInt or asDouble), a histogram's
	// or summary's sum.
	Value float64
	Int   bool // Value came as asInt

	Count          uint64    // histograms and summaries: the number of observations
	BucketCounts   []uint64  // explicit-bucket histograms
	ExplicitBounds []float64 // explicit-bucket histograms

	StartUnixNano uint64 // the start of a cumulative or delta interval, 0 if unset
	TimeUnixNano  uint64
}

// CollectedLog is one log record (or event) as the collector received it.
type CollectedLog struct {
	EventName string

	// Body and the values of Attributes are typed: string, int64, float64,
	// bool, []byte, []any or map[string]any (nil for an empty value).
	Body       any
	Attributes map[string]any
	Resource   map[string]string // the resource's attributes as strings
	Scope      string            // the instrumentation scope's name

	SeverityNumber int64
	SeverityText   string

	TimeUnixNano     uint64
	ObservedUnixNano uint64
}

// The OTLP JSON encoding (opentelemetry-proto's docs/specification.md): the
// proto3 JSON mapping with lowerCamelCase field names, 64-bit integers as
// decimal strings, enums as numbers, trace and span ids as hex. The decoders
// below accept numbers or strings where either may appear.

type otlpKeyValue struct {
	Key   string       `json:"key"`
	Value otlpAnyValue `json:"value"`
}

type otlpAnyValue struct {
	StringValue *string    `json:"stringValue"`
	BoolValue   *bool      `json:"boolValue"`
	IntValue    *jsonInt   `json:"intValue"`
	DoubleValue *jsonFloat `json:"doubleValue"`
	BytesValue  *string    `json:"bytesValue"` // base64
	ArrayValue  *struct {
		Values []otlpAnyValue `json:"values"`
	} `json:"arrayValue"`
	KvlistValue *struct {
		Values []otlpKeyValue `json:"values"`
	} `json:"kvlistValue"`
}

type otlpResource struct {
	Attributes []otlpKeyValue `json:"attributes"`
}

type otlpScope struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

type otlpNumberPoint struct {
	Attributes        []otlpKeyValue `json:"attributes"`
	StartTimeUnixNano jsonUint       `json:"startTimeUnixNano"`
	TimeUnixNano      jsonUint       `json:"timeUnixNano"`
	AsDouble          *jsonFloat     `json:"asDouble"`
	AsInt             *jsonInt       `json:"asInt"`
}

// otlpCountPoint is a histogram's, exponential histogram's or summary's data
// point (the fields this package reads).
type otlpCountPoint struct {
	Attributes        []otlpKeyValue `json:"attributes"`
	StartTimeUnixNano jsonUint       `json:"startTimeUnixNano"`
	TimeUnixNano      jsonUint       `json:"timeUnixNano"`
	Count             jsonUint       `json:"count"`
	Sum               *jsonFloat     `json:"sum"`
	BucketCounts      []jsonUint     `json:"bucketCounts"`
	ExplicitBounds    []jsonFloat    `json:"explicitBounds"`
}

type otlpCountData struct {
	DataPoints             []otlpCountPoint `json:"dataPoints"`
	AggregationTemporality json.RawMessage  `json:"aggregationTemporality"`
}

type otlpMetric struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Unit        string `json:"unit"`
	Sum         *struct {
		DataPoints             []otlpNumberPoint `json:"dataPoints"`
		AggregationTemporality json.RawMessage   `json:"aggregationTemporality"`
		IsMonotonic            bool              `json:"isMonotonic"`
	} `json:"sum"`
	Gauge *struct {
		DataPoints []otlpNumberPoint `json:"dataPoints"`
	} `json:"gauge"`
	Histogram            *otlpCountData `json:"histogram"`
	ExponentialHistogram *otlpCountData `json:"exponentialHistogram"`
	Summary              *otlpCountData `json:"summary"`
}

type otlpMetricsData struct {
	ResourceMetrics []struct {
		Resource     otlpResource `json:"resource"`
		ScopeMetrics []struct {
			Scope   otlpScope    `json:"scope"`
			Metrics []otlpMetric `json:"metrics"`
		} `json:"scopeMetrics"`
	} `json:"resourceMetrics"`
}

type otlpLogRecord struct {
	TimeUnixNano         jsonUint       `json:"timeUnixNano"`
	ObservedTimeUnixNano jsonUint       `json:"observedTimeUnixNano"`
	SeverityNumber       jsonInt        `json:"severityNumber"`
	SeverityText         string         `json:"severityText"`
	Body                 *otlpAnyValue  `json:"body"`
	Attributes           []otlpKeyValue `json:"attributes"`
	EventName            string         `json:"eventName"`
}

type otlpLogsData struct {
	ResourceLogs []struct {
		Resource  otlpResource `json:"resource"`
		ScopeLogs []struct {
			Scope      otlpScope       `json:"scope"`
			LogRecords []otlpLogRecord `json:"logRecords"`
		} `json:"scopeLogs"`
	} `json:"resourceLogs"`
}

// jsonUint is a uint64 written as a JSON number or a decimal string.
type jsonUint uint64

func (u *jsonUint) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := strconv.ParseUint(string(bytes.Trim(b, `"`)), 10, 64)
	if err != nil {
		return fmt.Errorf("uint64 %s: %w", b, err)
	}
	*u = jsonUint(v)
	return nil
}

// jsonInt is an int64 written as a JSON number or a decimal string.
type jsonInt int64

func (i *jsonInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := strconv.ParseInt(string(bytes.Trim(b, `"`)), 10, 64)
	if err != nil {
		return fmt.Errorf("int64 %s: %w", b, err)
	}
	*i = jsonInt(v)
	return nil
}

// jsonFloat is a double written as a JSON number or as one of the strings
// "NaN", "Infinity", "-Infinity" (or a number in a string).
type jsonFloat float64

func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	s := string(bytes.Trim(b, `"`))
	switch s {
	case "NaN":
		*f = jsonFloat(math.NaN())
	case "Infinity":
		*f = jsonFloat(math.Inf(1))
	case "-Infinity":
		*f = jsonFloat(math.Inf(-1))
	default:
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("double %s: %w", b, err)
		}
		*f = jsonFloat(v)
	}
	return nil
}

// temporality names an AggregationTemporality given as its number or its
// enum name.
func temporality(raw json.RawMessage) (string, error) {
	switch s := string(bytes.Trim(raw, `"`)); s {
	case "", "0", "AGGREGATION_TEMPORALITY_UNSPECIFIED":
		return "", nil
	case "1", "AGGREGATION_TEMPORALITY_DELTA":
		return "delta", nil
	case "2", "AGGREGATION_TEMPORALITY_CUMULATIVE":
		return "cumulative", nil
	default:
		return "", fmt.Errorf("aggregationTemporality %s", raw)
	}
}

// typed returns v as string, int64, float64, bool, []byte, []any or
// map[string]any, or nil when it holds no value.
func (v otlpAnyValue) typed() (any, error) {
	switch {
	case v.StringValue != nil:
		return *v.StringValue, nil
	case v.BoolValue != nil:
		return *v.BoolValue, nil
	case v.IntValue != nil:
		return int64(*v.IntValue), nil
	case v.DoubleValue != nil:
		return float64(*v.DoubleValue), nil
	case v.BytesValue != nil:
		b, err := base64.StdEncoding.DecodeString(*v.BytesValue)
		if err != nil {
			return nil, fmt.Errorf("bytesValue: %w", err)
		}
		return b, nil
	case v.ArrayValue != nil:
		out := make([]any, 0, len(v.ArrayValue.Values))
		for _, e := range v.ArrayValue.Values {
			x, err := e.typed()
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	case v.KvlistValue != nil:
		return typedAttrs(v.KvlistValue.Values)
	}
	return nil, nil
}

// typedAttrs returns attributes with typed values (otlpAnyValue.typed).
func typedAttrs(kvs []otlpKeyValue) (map[string]any, error) {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := kv.Value.typed()
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", kv.Key, err)
		}
		out[kv.Key] = v
	}
	return out, nil
}

// attrString formats a typed value as a string: a string as it is, numbers
// in Go's shortest form (int64 in decimal, float64 with 'g'), bools as
// true/false, bytes in base64, arrays and maps as JSON, nil as "".
func attrString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// stringAttrs returns attributes with their values as strings (attrString).
func stringAttrs(kvs []otlpKeyValue) (map[string]string, error) {
	typed, err := typedAttrs(kvs)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(typed))
	for k, v := range typed {
		out[k] = attrString(v)
	}
	return out, nil
}

// parseOTLPMetricsLines parses lines of OTLP JSON MetricsData (one object a
// line, empty lines skipped) into their data points, in order.
func parseOTLPMetricsLines(b []byte) ([]CollectedPoint, error) {
	var out []CollectedPoint
	for n, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		pts, err := parseOTLPMetrics(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		out = append(out, pts...)
	}
	return out, nil
}

// parseOTLPMetrics parses one OTLP JSON MetricsData object (an
// ExportMetricsServiceRequest's JSON is the same) into its data points.
func parseOTLPMetrics(b []byte) ([]CollectedPoint, error) {
	var md otlpMetricsData
	if err := json.Unmarshal(b, &md); err != nil {
		return nil, fmt.Errorf("OTLP JSON metrics: %w", err)
	}
	var out []CollectedPoint
	for _, rm := range md.ResourceMetrics {
		res, err := stringAttrs(rm.Resource.Attributes)
		if err != nil {
			return nil, fmt.Errorf("resource: %w", err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				base := CollectedPoint{Metric: m.Name, Description: m.Description, Unit: m.Unit, Resource: res, Scope: sm.Scope.Name}
				pts, err := metricPoints(base, m)
				if err != nil {
					return nil, fmt.Errorf("metric %q: %w", m.Name, err)
				}
				out = append(out, pts...)
			}
		}
	}
	return out, nil
}

// metricPoints expands m's data points, each a copy of base.
func metricPoints(base CollectedPoint, m otlpMetric) ([]CollectedPoint, error) {
	var out []CollectedPoint
	number := func(dps []otlpNumberPoint) error {
		for _, dp := range dps {
			p := base
			var err error
			if p.Attributes, err = stringAttrs(dp.Attributes); err != nil {
				return err
			}
			p.StartUnixNano, p.TimeUnixNano = uint64(dp.StartTimeUnixNano), uint64(dp.TimeUnixNano)
			switch {
			case dp.AsInt != nil:
				p.Value, p.Int = float64(*dp.AsInt), true
			case dp.AsDouble != nil:
				p.Value = float64(*dp.AsDouble)
			}
			out = append(out, p)
		}
		return nil
	}
	counts := func(typ string, d *otlpCountData) error {
		temp, err := temporality(d.AggregationTemporality)
		if err != nil {
			return err
		}
		for _, dp := range d.DataPoints {
			p := base
			p.Type, p.Temporality = typ, temp
			if p.Attributes, err = stringAttrs(dp.Attributes); err != nil {
				return err
			}
			p.StartUnixNano, p.TimeUnixNano = uint64(dp.StartTimeUnixNano), uint64(dp.TimeUnixNano)
			p.Count = uint64(dp.Count)
			if dp.Sum != nil {
				p.Value = float64(*dp.Sum)
			}
			for _, c := range dp.BucketCounts {
				p.BucketCounts = append(p.BucketCounts, uint64(c))
			}
			for _, e := range dp.ExplicitBounds {
				p.ExplicitBounds = append(p.ExplicitBounds, float64(e))
			}
			out = append(out, p)
		}
		return nil
	}
	var err error
	switch {
	case m.Sum != nil:
		base.Type, base.Monotonic = "sum", m.Sum.IsMonotonic
		if base.Temporality, err = temporality(m.Sum.AggregationTemporality); err == nil {
			err = number(m.Sum.DataPoints)
		}
	case m.Gauge != nil:
		base.Type = "gauge"
		err = number(m.Gauge.DataPoints)
	case m.Histogram != nil:
		err = counts("histogram", m.Histogram)
	case m.ExponentialHistogram != nil:
		err = counts("exponential_histogram", m.ExponentialHistogram)
	case m.Summary != nil:
		err = counts("summary", m.Summary)
	default:
		err = fmt.Errorf("no data (sum, gauge, histogram, exponentialHistogram or summary)")
	}
	return out, err
}

// parseOTLPLogsLines parses lines of OTLP JSON LogsData (one object a line,
// empty lines skipped) into their records, in order.
func parseOTLPLogsLines(b []byte) ([]CollectedLog, error) {
	var out []CollectedLog
	for n, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		logs, err := parseOTLPLogs(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		out = append(out, logs...)
	}
	return out, nil
}

// parseOTLPLogs parses one OTLP JSON LogsData object (an
// ExportLogsServiceRequest's JSON is the same) into its records.
func parseOTLPLogs(b []byte) ([]CollectedLog, error) {
	var ld otlpLogsData
	if err := json.Unmarshal(b, &ld); err != nil {
		return nil, fmt.Errorf("OTLP JSON logs: %w", err)
	}
	var out []CollectedLog
	for _, rl := range ld.ResourceLogs {
		res, err := stringAttrs(rl.Resource.Attributes)
		if err != nil {
			return nil, fmt.Errorf("resource: %w", err)
		}
		for _, sl := range rl.ScopeLogs {
			for i, r := range sl.LogRecords {
				l := CollectedLog{EventName: r.EventName, Resource: res, Scope: sl.Scope.Name,
					SeverityNumber: int64(r.SeverityNumber), SeverityText: r.SeverityText,
					TimeUnixNano: uint64(r.TimeUnixNano), ObservedUnixNano: uint64(r.ObservedTimeUnixNano)}
				if l.Attributes, err = typedAttrs(r.Attributes); err != nil {
					return nil, fmt.Errorf("log record %d: %w", i, err)
				}
				if r.Body != nil {
					if l.Body, err = r.Body.typed(); err != nil {
						return nil, fmt.Errorf("log record %d body: %w", i, err)
					}
				}
				out = append(out, l)
			}
		}
	}
	return out, nil
}

package testenv

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseOTLPMetrics(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines string
		want  []CollectedPoint
	}{{
		name:  "jsonfile exporter line (as the collector wrote it)",
		lines: `{"resourceMetrics":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"x"}}]},"scopeMetrics":[{"scope":{},"metrics":[{"name":"m","unit":"s","sum":{"dataPoints":[{"attributes":[{"key":"a","value":{"intValue":"3"}}],"startTimeUnixNano":"1600000000000000000","timeUnixNano":"1700000000000000000","asDouble":1.5}],"aggregationTemporality":2,"isMonotonic":true}}]}]}]}` + "\n",
		want: []CollectedPoint{{Metric: "m", Unit: "s", Type: "sum", Temporality: "cumulative", Monotonic: true,
			Attributes: map[string]string{"a": "3"}, Resource: map[string]string{"service.name": "x"},
			Value: 1.5, StartUnixNano: 1600000000000000000, TimeUnixNano: 1700000000000000000}},
	}, {
		name: "enum names, numbers for 64-bit integers, typed attribute values as strings, empty lines",
		lines: "\n" + compactJSON(t, `{"resourceMetrics":[{"resource":{"attributes":[{"key":"b","value":{"boolValue":false}},{"key":"d","value":{"doubleValue":0.5}},{"key":"bytes","value":{"bytesValue":"AQI="}},{"key":"list","value":{"arrayValue":{"values":[{"intValue":1},{"stringValue":"x"}]}}},{"key":"empty","value":{}}]},
			"scopeMetrics":[{"scope":{"name":"s","version":"1"},"metrics":[
			{"name":"delta","sum":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_DELTA","dataPoints":[{"timeUnixNano":5,"asInt":-7},{"timeUnixNano":"6","asInt":"8"}]}},
			{"name":"g","gauge":{"dataPoints":[{"timeUnixNano":null,"asDouble":"Infinity"}]}}]}]}]}`) + "\n\n",
		want: []CollectedPoint{
			{Metric: "delta", Type: "sum", Temporality: "delta", Resource: map[string]string{"b": "false", "d": "0.5", "bytes": "AQI=", "list": `[1,"x"]`, "empty": ""}, Scope: "s", Value: -7, Int: true, TimeUnixNano: 5},
			{Metric: "delta", Type: "sum", Temporality: "delta", Resource: map[string]string{"b": "false", "d": "0.5", "bytes": "AQI=", "list": `[1,"x"]`, "empty": ""}, Scope: "s", Value: 8, Int: true, TimeUnixNano: 6},
			{Metric: "g", Type: "gauge", Resource: map[string]string{"b": "false", "d": "0.5", "bytes": "AQI=", "list": `[1,"x"]`, "empty": ""}, Scope: "s", Value: math.Inf(1)},
		},
	}, {
		name: "histogram, exponential histogram, summary",
		lines: compactJSON(t, `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
			{"name":"h","unit":"s","histogram":{"aggregationTemporality":2,"dataPoints":[{"count":"4","sum":1.25,"bucketCounts":["1","3","0"],"explicitBounds":[0.5,1]}]}},
			{"name":"e","exponentialHistogram":{"aggregationTemporality":1,"dataPoints":[{"count":"2","sum":3}]}},
			{"name":"q","summary":{"dataPoints":[{"count":"9","sum":"NaN"}]}}]}]}]}`),
		want: []CollectedPoint{
			{Metric: "h", Unit: "s", Type: "histogram", Temporality: "cumulative", Value: 1.25, Count: 4, BucketCounts: []uint64{1, 3, 0}, ExplicitBounds: []float64{0.5, 1}},
			{Metric: "e", Type: "exponential_histogram", Temporality: "delta", Value: 3, Count: 2},
			{Metric: "q", Type: "summary", Value: math.NaN(), Count: 9},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOTLPMetricsLines([]byte(tc.lines))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty(), cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// compactJSON returns s, one JSON value, on one line.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestParseOTLPLogs(t *testing.T) {
	// As the jsonfile exporter wrote it, and one with every field set.
	lines := `{"resourceLogs":[{"resource":{},"scopeLogs":[{"scope":{},"logRecords":[{"body":{"stringValue":"hi"},"attributes":[{"key":"n","value":{"intValue":"5"}},{"key":"d","value":{"doubleValue":2.5}},{"key":"b","value":{"boolValue":true}}],"eventName":"ev"}]}]}]}
{"resourceLogs":[{"resource":{"attributes":[{"key":"k8s.pod.uid","value":{"stringValue":"u"}}]},"scopeLogs":[{"scope":{"name":"statsagent"},"logRecords":[{"timeUnixNano":"10","observedTimeUnixNano":"11","severityNumber":13,"severityText":"WARN","body":{"kvlistValue":{"values":[{"key":"a","value":{"arrayValue":{"values":[{"boolValue":false}]}}}]}},"attributes":[{"key":"raw","value":{"bytesValue":"AQI="}}]}]}]}]}
`
	want := []CollectedLog{
		{EventName: "ev", Body: "hi", Attributes: map[string]any{"n": int64(5), "d": 2.5, "b": true}},
		{Body: map[string]any{"a": []any{false}}, Attributes: map[string]any{"raw": []byte{1, 2}}, Resource: map[string]string{"k8s.pod.uid": "u"},
			Scope: "statsagent", SeverityNumber: 13, SeverityText: "WARN", TimeUnixNano: 10, ObservedUnixNano: 11},
	}
	got, err := parseOTLPLogsLines([]byte(lines))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseOTLPErrors(t *testing.T) {
	for name, line := range map[string]string{
		"not JSON":               `{"resourceMetrics":`,
		"int64 not a number":     `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":[{"asInt":"x"}]}}]}]}]}`,
		"unknown temporality":    `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","sum":{"aggregationTemporality":7}}]}]}]}`,
		"metric without data":    `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m"}]}]}]}`,
		"attribute bad base64":   `{"resourceMetrics":[{"resource":{"attributes":[{"key":"k","value":{"bytesValue":"!"}}]}}]}`,
		"double not a number":    `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":[{"asDouble":"one"}]}}]}]}]}`,
		"uint64 negative (time)": `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":[{"timeUnixNano":"-1"}]}}]}]}]}`,
	} {
		if _, err := parseOTLPMetricsLines([]byte(line)); err == nil {
			t.Errorf("metrics, %s: no error", name)
		}
	}
	if _, err := parseOTLPLogsLines([]byte(`{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"intValue":"1.5"}}]}]}]}`)); err == nil {
		t.Error("logs, a body's int64 not an integer: no error")
	}
}

// TestReadCollectorFile: a file not written yet reads as empty, a last line
// without its newline (a write in progress) is left out.
func TestReadCollectorFile(t *testing.T) {
	dir := t.TempDir()
	if b, err := readCollectorFile(filepath.Join(dir, "missing.jsonl")); err != nil || len(b) != 0 {
		t.Errorf("missing file: %q, %v; want empty, nil", b, err)
	}
	p := filepath.Join(dir, "metrics.jsonl")
	if err := os.WriteFile(p, []byte("{\"a\":1}\n{\"resourceMe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := readCollectorFile(p); err != nil || string(b) != "{\"a\":1}\n" {
		t.Errorf("partial last line: %q, %v; want the first line", b, err)
	}
}

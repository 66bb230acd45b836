package nodeagent

import (
	"bytes"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// expfmtText is what expfmt's text encoder writes for f in the format a
// scrape without Accept negotiates (promhttp's), or false if it fails.
func expfmtText(f *dto.MetricFamily) (string, bool) {
	var buf bytes.Buffer
	if err := expfmt.NewEncoder(&buf, expfmt.NegotiateAccept(nil, expfmt.DefaultAcceptedFormats()...)).Encode(f); err != nil {
		return "", false
	}
	return buf.String(), true
}

func lp(name, value string) *dto.LabelPair { return &dto.LabelPair{Name: &name, Value: &value} }

// TestAppendTextAsExpfmt: appendText writes expfmt's bytes for every kind
// of family, and refuses those it would write otherwise.
func TestAppendTextAsExpfmt(t *testing.T) {
	counter := func(v float64, labels ...*dto.LabelPair) *dto.Metric {
		return &dto.Metric{Label: labels, Counter: &dto.Counter{Value: &v}}
	}
	fam := func(name string, typ dto.MetricType, help *string, ms ...*dto.Metric) *dto.MetricFamily {
		return &dto.MetricFamily{Name: &name, Type: &typ, Help: help, Metric: ms}
	}
	for _, tc := range []struct {
		name string
		f    *dto.MetricFamily
		ok   bool
	}{
		{"counter with labels", fam("sandboxstats_workload_cpu_seconds_total", dto.MetricType_COUNTER, proto.String("CPU."),
			counter(12.5, lp("actor_uid", "a"), lp("pod", "p")), counter(0, lp("actor_uid", "b"), lp("pod", "q"))), true},
		{"no help, no labels", fam("x", dto.MetricType_COUNTER, nil, counter(1)), true},
		{"help and label values to escape", fam("x", dto.MetricType_GAUGE, proto.String(`a\b`+"\n\"c\""),
			&dto.Metric{Label: []*dto.LabelPair{lp("l", `q"\`+"\n")}, Gauge: &dto.Gauge{Value: proto.Float64(-1)}}), true},
		{"special values", fam("x", dto.MetricType_GAUGE, nil,
			&dto.Metric{Label: []*dto.LabelPair{lp("v", "nan")}, Gauge: &dto.Gauge{Value: proto.Float64(math.NaN())}},
			&dto.Metric{Label: []*dto.LabelPair{lp("v", "inf")}, Gauge: &dto.Gauge{Value: proto.Float64(math.Inf(1))}},
			&dto.Metric{Label: []*dto.LabelPair{lp("v", "-inf")}, Gauge: &dto.Gauge{Value: proto.Float64(math.Inf(-1))}},
			&dto.Metric{Label: []*dto.LabelPair{lp("v", "small")}, Gauge: &dto.Gauge{Value: proto.Float64(1e-300)}},
			&dto.Metric{Label: []*dto.LabelPair{lp("v", "big")}, Gauge: &dto.Gauge{Value: proto.Float64(1.8446744073709552e19)}}), true},
		{"timestamp", fam("x", dto.MetricType_UNTYPED, nil,
			&dto.Metric{Untyped: &dto.Untyped{Value: proto.Float64(3)}, TimestampMs: proto.Int64(1700000000123)}), true},
		{"summary", fam("x_seconds", dto.MetricType_SUMMARY, proto.String("s"),
			&dto.Metric{Label: []*dto.LabelPair{lp("a", "b")}, Summary: &dto.Summary{SampleCount: proto.Uint64(7), SampleSum: proto.Float64(0.25),
				Quantile: []*dto.Quantile{{Quantile: proto.Float64(0.5), Value: proto.Float64(0.01)}, {Quantile: proto.Float64(1), Value: proto.Float64(0.2)}}}}), true},
		{"histogram without +Inf", fam("x_seconds", dto.MetricType_HISTOGRAM, nil,
			&dto.Metric{Histogram: &dto.Histogram{SampleCount: proto.Uint64(9), SampleSum: proto.Float64(4.5),
				Bucket: []*dto.Bucket{{UpperBound: proto.Float64(0.1), CumulativeCount: proto.Uint64(2)}, {UpperBound: proto.Float64(1), CumulativeCount: proto.Uint64(5)}}}}), true},
		{"histogram with +Inf and float counts", fam("x_seconds", dto.MetricType_GAUGE_HISTOGRAM, nil,
			&dto.Metric{Histogram: &dto.Histogram{SampleCountFloat: proto.Float64(2.5), SampleSum: proto.Float64(1),
				Bucket: []*dto.Bucket{{UpperBound: proto.Float64(math.Inf(1)), CumulativeCountFloat: proto.Float64(2.5)}}}}), true},
		{"a name with a colon", fam("a:b", dto.MetricType_COUNTER, nil, counter(1, lp("c:d", "e"))), true},
		{"a UTF-8 name", fam("a.b", dto.MetricType_COUNTER, nil, counter(1)), false},
		{"a UTF-8 label name", fam("x", dto.MetricType_COUNTER, nil, counter(1, lp("é", "e"))), false},
		{"a __name__ label", fam("x", dto.MetricType_COUNTER, nil, counter(1, lp("__name__", "a.b"))), false},
		{"no metrics", fam("x", dto.MetricType_COUNTER, nil), false},
		{"a counter without its value", fam("x", dto.MetricType_COUNTER, nil, &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(1)}}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := appendText([]byte("before\n"), tc.f, map[string]bool{})
			if ok != tc.ok {
				t.Fatalf("appendText ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			want, wok := expfmtText(tc.f)
			if !wok {
				t.Fatal("expfmt refuses what appendText writes")
			}
			if d := cmp.Diff("before\n"+want, string(got)); d != "" {
				t.Errorf("(-expfmt +appendText):\n%s", d)
			}
		})
	}
}

// FuzzAppendText: whatever appendText writes is expfmt's text.
func FuzzAppendText(f *testing.F) {
	f.Add("sandboxstats_x_total", "help \\ \n", "actor_uid", "v\"\\\n", 1.5, int64(0), uint8(0))
	f.Add("a:b", "", "é", "", math.Inf(1), int64(-5), uint8(4))
	f.Add("x", "h", "__name__", "a.b", math.Copysign(0, -1), int64(7), uint8(3))
	f.Fuzz(func(t *testing.T, name, help, label, value string, v float64, ts int64, kind uint8) {
		m := &dto.Metric{Label: []*dto.LabelPair{lp(label, value)}}
		typ := dto.MetricType(kind % 6)
		switch typ {
		case dto.MetricType_COUNTER:
			m.Counter = &dto.Counter{Value: &v}
		case dto.MetricType_GAUGE:
			m.Gauge = &dto.Gauge{Value: &v}
		case dto.MetricType_SUMMARY:
			m.Summary = &dto.Summary{SampleSum: &v, SampleCount: proto.Uint64(uint64(ts)), Quantile: []*dto.Quantile{{Quantile: proto.Float64(0.9), Value: &v}}}
		case dto.MetricType_UNTYPED:
			m.Untyped = &dto.Untyped{Value: &v}
		default:
			m.Histogram = &dto.Histogram{SampleSum: &v, SampleCount: proto.Uint64(uint64(ts)), Bucket: []*dto.Bucket{{UpperBound: &v, CumulativeCount: proto.Uint64(1)}}}
		}
		if ts%2 == 0 {
			m.TimestampMs = &ts
		}
		fam := &dto.MetricFamily{Name: &name, Type: &typ, Metric: []*dto.Metric{m}}
		if help != "" {
			fam.Help = &help
		}
		got, ok := appendText(nil, fam, map[string]bool{})
		if !ok {
			return
		}
		want, wok := expfmtText(fam)
		if !wok || want != string(got) {
			t.Fatalf("appendText %q; expfmt %q (%v)", got, want, wok)
		}
	})
}

package otlp

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// wireFixture has every kind and field wire.go encodes: attribute values
// of each type, zero values, a long attribute (a length of two bytes),
// exemplars, histograms with and without extrema, and a point before the
// epoch's start (the zero time).
func wireFixture(t testing.TB) *metricdata.ResourceMetrics {
	t.Helper()
	res, err := resource.Merge(resource.Empty(), resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0",
		attribute.String("host.name", "node-1"), attribute.Int("n", 3), attribute.Bool("b", false), attribute.Float64("f", 0.5),
		attribute.StringSlice("ss", []string{"a", ""}), attribute.Int64Slice("is", []int64{-1, 2}),
		attribute.BoolSlice("bs", []bool{true}), attribute.Float64Slice("fs", []float64{1.5})))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_796_000_000, 123)
	long := attribute.NewSet(attribute.String("sandboxstats.actor.uid", string(make([]byte, 300))), attribute.String("k", "v"))
	set := attribute.NewSet(attribute.String("sandboxstats.actor.uid", "uid-1"), attribute.String("sandboxstats.sandbox.class", "gvisor"))
	return &metricdata.ResourceMetrics{Resource: res, ScopeMetrics: []metricdata.ScopeMetrics{
		{Scope: instrumentation.Scope{Name: "sandboxstats", Version: "v1", SchemaURL: "https://example/schema", Attributes: attribute.NewSet(attribute.String("s", "x"))},
			Metrics: []metricdata.Metrics{
				{Name: "sandboxstats.workload.cpu.time", Description: "CPU", Unit: "s", Data: metricdata.Sum[float64]{
					Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
					DataPoints: []metricdata.DataPoint[float64]{
						{Attributes: set, StartTime: t0, Time: t0.Add(time.Second), Value: 1.25},
						{Attributes: long, StartTime: t0, Time: t0.Add(time.Second), Value: 0},
					}}},
				{Name: "sandboxstats.workload.restarts", Unit: "{restart}", Data: metricdata.Sum[int64]{
					Temporality: metricdata.DeltaTemporality,
					DataPoints: []metricdata.DataPoint[int64]{{Attributes: set, StartTime: t0, Time: t0.Add(time.Second), Value: -7,
						Exemplars: []metricdata.Exemplar[int64]{{FilteredAttributes: []attribute.KeyValue{attribute.String("e", "1")}, Time: t0, Value: 4,
							SpanID: []byte{1, 2, 3, 4, 5, 6, 7, 8}, TraceID: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}}}}}},
				{Name: "sandboxstats.workload.memory.usage", Unit: "By", Data: metricdata.Gauge[int64]{
					DataPoints: []metricdata.DataPoint[int64]{{Attributes: set, Time: t0, Value: 1 << 40}, {Time: t0}}}},
				{Name: "sandboxstats.workload.memory.ratio", Data: metricdata.Gauge[float64]{
					DataPoints: []metricdata.DataPoint[float64]{{Attributes: set, StartTime: time.Unix(0, 0).Add(-time.Hour), Time: t0, Value: -0.5,
						Exemplars: []metricdata.Exemplar[float64]{{Time: t0, Value: 0.25}}}}}},
				{Name: "sandboxstats.agent.sweep.duration", Unit: "s", Data: metricdata.Histogram[float64]{
					Temporality: metricdata.CumulativeTemporality,
					DataPoints: []metricdata.HistogramDataPoint[float64]{
						{Attributes: set, StartTime: t0, Time: t0, Count: 3, Sum: 2.5, Bounds: []float64{0.1, 1}, BucketCounts: []uint64{1, 1, 1},
							Min: metricdata.NewExtrema(0.05), Max: metricdata.NewExtrema(2.0)},
						{StartTime: t0, Time: t0, Bounds: []float64{1}, BucketCounts: []uint64{0, 0}},
					}}},
				{Name: "sandboxstats.test.int.histogram", Data: metricdata.Histogram[int64]{
					Temporality: metricdata.DeltaTemporality,
					DataPoints:  []metricdata.HistogramDataPoint[int64]{{Time: t0, Count: 1, Sum: -3, Min: metricdata.NewExtrema[int64](-3)}}}},
			}},
		{Scope: instrumentation.Scope{Name: "empty"}},
	}}
}

// sdkRequest is what the SDK's OTLP/HTTP exporter sends for rm.
func sdkRequest(t *testing.T, rm *metricdata.ResourceMetrics) *colmetricpb.ExportMetricsServiceRequest {
	t.Helper()
	body, err := sdkBodies(t)(rm)
	if err != nil {
		t.Fatal(err)
	}
	var req colmetricpb.ExportMetricsServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	return &req
}

// The wire encoding decodes to the request the SDK's exporter sends.
func TestAppendMetricsRequestIsTheSDKs(t *testing.T) {
	rm := wireFixture(t)
	if !wireEncodable(rm) {
		t.Fatal("the fixture is not wire-encodable")
	}
	want := sdkRequest(t, rm)
	var got colmetricpb.ExportMetricsServiceRequest
	if err := proto.Unmarshal(appendMetricsRequest([]byte("kept"), rm)[len("kept"):], &got); err != nil {
		t.Fatal(err)
	}
	if n := len(want.GetResourceMetrics()[0].GetScopeMetrics()[0].GetMetrics()); n != 6 {
		t.Fatalf("the SDK sent %d metrics of the fixture's 6", n)
	}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("wire request (-sdk +wire):\n%s", diff)
	}
}

// Kinds or temporalities wire.go does not encode go to the SDK.
func TestWireEncodable(t *testing.T) {
	for _, tc := range []struct {
		name string
		data metricdata.Aggregation
		want bool
	}{
		{"sum", metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality}, true},
		{"sum without temporality", metricdata.Sum[float64]{}, false},
		{"histogram without temporality", metricdata.Histogram[float64]{}, false},
		{"exponential histogram", metricdata.ExponentialHistogram[float64]{Temporality: metricdata.CumulativeTemporality}, false},
		{"summary", metricdata.Summary{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rm := &metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{{Name: "m", Data: tc.data}}}}}
			if got := wireEncodable(rm); got != tc.want {
				t.Fatalf("wireEncodable = %v, want %v", got, tc.want)
			}
		})
	}
}

// BenchmarkAppendMetricsRequest encodes the fixture; no allocation once
// the buffer has grown.
func BenchmarkAppendMetricsRequest(b *testing.B) {
	rm := wireFixture(b)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendMetricsRequest(buf[:0], rm)
	}
}

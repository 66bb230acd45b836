package otlp

import (
	"bytes"
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// roundTripFunc is an http.RoundTripper: the SDK's exporter is run without
// a socket.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sdkBodies runs the SDK's OTLP/HTTP exporter on a transport that keeps
// the request bodies: send returns what the SDK sends for rm, or its error.
func sdkBodies(t testing.TB) (send func(rm *metricdata.ResourceMetrics) ([]byte, error)) {
	var body []byte
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		var err error
		body, err = io.ReadAll(r.Body)
		r.Body.Close()
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(nil)), Request: r}, err
	})}
	exp, err := otlpmetrichttp.New(context.Background(), otlpmetrichttp.WithEndpointURL("http://sdk.invalid/v1/metrics"),
		otlpmetrichttp.WithHTTPClient(client), otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	return func(rm *metricdata.ResourceMetrics) ([]byte, error) {
		body = nil
		err := exp.Export(context.Background(), rm)
		return body, err
	}
}

// randomMetrics builds a random collection of every kind wire.go encodes.
// With clean, each string is what validUTF8 makes of it: two generators of
// the same seed, one clean, build the same collection but for the strings.
type randomMetrics struct {
	r     *rand.Rand
	clean bool
}

var (
	edgeFloats = []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), -1.5, math.MaxFloat64, math.SmallestNonzeroFloat64}
	edgeInts   = []int64{0, -1, 1, math.MinInt64, math.MaxInt64, 1 << 40}
	// edgeLengths cross the one, two and three byte varint lengths of a
	// string and of the messages around it.
	edgeLengths = []int{1, 100, 126, 127, 128, 129, 16250, 16383, 16384, 16385, 40000}
	// badUTF8 are strings that are not UTF-8.
	badUTF8 = []string{"node\xff", "\xc3(", "\xed\xa0\x80", "a\xf0\x28\x8c\x28b", "\x80"}
)

func (g *randomMetrics) fix(s string) string {
	if g.clean {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}

func (g *randomMetrics) str() string {
	r := g.r
	switch r.IntN(6) {
	case 0:
		return ""
	case 1:
		return strings.Repeat("x", edgeLengths[r.IntN(len(edgeLengths))])
	case 2:
		return "é☃\U0001F600"
	case 3:
		return g.fix(badUTF8[r.IntN(len(badUTF8))] + strings.Repeat("y", r.IntN(3)*127))
	default:
		return "v" + strings.Repeat("y", r.IntN(200))
	}
}

func (g *randomMetrics) value(depth int) attribute.Value {
	r := g.r
	switch r.IntN(14) {
	case 0:
		return attribute.BoolValue(r.IntN(2) == 1)
	case 1:
		return attribute.Int64Value(edgeInts[r.IntN(len(edgeInts))])
	case 2:
		return attribute.Float64Value(edgeFloats[r.IntN(len(edgeFloats))])
	case 3:
		return attribute.StringSliceValue([]string{g.str(), "", g.str()})
	case 4:
		return attribute.Int64SliceValue([]int64{edgeInts[r.IntN(len(edgeInts))], edgeInts[r.IntN(len(edgeInts))]})
	case 5:
		return attribute.BoolSliceValue([]bool{false, r.IntN(2) == 1})
	case 6:
		return attribute.Float64SliceValue([]float64{edgeFloats[r.IntN(len(edgeFloats))]})
	case 7:
		return attribute.ByteSliceValue([][]byte{nil, {}, {0xff, 0}}[r.IntN(3)])
	case 8:
		if depth < 2 {
			return attribute.SliceValue(g.value(depth+1), g.value(depth+1))
		}
		return attribute.Value{}
	case 9:
		if depth < 2 {
			return attribute.MapValue(attribute.KeyValue{Key: "m", Value: g.value(depth + 1)},
				attribute.KeyValue{Key: attribute.Key(g.fix("\xfe")), Value: g.value(depth + 1)}, attribute.KeyValue{Key: "", Value: g.value(depth + 1)})
		}
		return attribute.Value{}
	case 10:
		return attribute.Value{} // EMPTY
	case 11:
		return attribute.StringSliceValue(nil)
	default:
		return attribute.StringValue(g.str())
	}
}

// set has at most one key that is not UTF-8 ("k\xff"), which sorts as its
// U+FFFD form does among the others.
func (g *randomMetrics) set() attribute.Set {
	n := g.r.IntN(5)
	kv := make([]attribute.KeyValue, 0, n)
	for range n {
		key := []string{"", "a", "b", "c", g.fix("k\xff"), "long." + strings.Repeat("k", 150)}[g.r.IntN(6)]
		kv = append(kv, attribute.KeyValue{Key: attribute.Key(key), Value: g.value(0)})
	}
	return attribute.NewSet(kv...)
}

func (g *randomMetrics) time() time.Time {
	switch g.r.IntN(4) {
	case 0:
		return time.Time{}
	case 1:
		return time.Unix(0, 0)
	case 2:
		return time.Unix(-5, 0)
	}
	return time.Unix(1_796_000_000, int64(g.r.IntN(1e9)))
}

func randomExemplars[N int64 | float64](g *randomMetrics, v func() N) []metricdata.Exemplar[N] {
	var es []metricdata.Exemplar[N]
	for i := g.r.IntN(3); i > 0; i-- {
		e := metricdata.Exemplar[N]{Time: g.time(), Value: v()}
		if g.r.IntN(2) == 0 {
			e.SpanID = []byte{1, 2, 3, 4, 5, 6, 7, 8}
			e.TraceID = make([]byte, 16)
			s := g.set()
			e.FilteredAttributes = s.ToSlice()
		}
		es = append(es, e)
	}
	return es
}

func randomNumbers[N int64 | float64](g *randomMetrics, v func() N) []metricdata.DataPoint[N] {
	var pts []metricdata.DataPoint[N]
	for range g.r.IntN(4) {
		pts = append(pts, metricdata.DataPoint[N]{Attributes: g.set(), StartTime: g.time(), Time: g.time(), Value: v(), Exemplars: randomExemplars(g, v)})
	}
	return pts
}

func randomHistogram[N int64 | float64](g *randomMetrics, v func() N) []metricdata.HistogramDataPoint[N] {
	var pts []metricdata.HistogramDataPoint[N]
	for range g.r.IntN(4) {
		p := metricdata.HistogramDataPoint[N]{Attributes: g.set(), StartTime: g.time(), Time: g.time(),
			Count: uint64(g.r.IntN(3)) * (math.MaxUint64 / 2), Sum: v(), Exemplars: randomExemplars(g, v)}
		for range g.r.IntN(4) {
			p.Bounds = append(p.Bounds, edgeFloats[g.r.IntN(len(edgeFloats))])
			p.BucketCounts = append(p.BucketCounts, uint64(g.r.IntN(2))*math.MaxUint64)
		}
		if len(p.Bounds) > 0 {
			p.BucketCounts = append(p.BucketCounts, 1)
		}
		if g.r.IntN(2) == 0 {
			p.Min, p.Max = metricdata.NewExtrema(v()), metricdata.NewExtrema(v())
		}
		pts = append(pts, p)
	}
	return pts
}

func (g *randomMetrics) metrics() *metricdata.ResourceMetrics {
	r := g.r
	rs := g.set()
	res, err := resource.Merge(resource.Empty(), resource.NewWithAttributes(g.str(), rs.ToSlice()...))
	if err != nil {
		panic(err)
	}
	fv := func() float64 { return edgeFloats[r.IntN(len(edgeFloats))] }
	iv := func() int64 { return edgeInts[r.IntN(len(edgeInts))] }
	temps := []metricdata.Temporality{metricdata.CumulativeTemporality, metricdata.DeltaTemporality}
	rm := &metricdata.ResourceMetrics{Resource: res}
	for s := r.IntN(3); s >= 0; s-- {
		sm := metricdata.ScopeMetrics{Scope: instrumentation.Scope{Name: g.str(), Version: g.str(), SchemaURL: g.str(), Attributes: g.set()}}
		for m := r.IntN(5); m >= 0; m-- {
			met := metricdata.Metrics{Name: g.str(), Description: g.str(), Unit: g.str()}
			switch r.IntN(6) {
			case 0:
				met.Data = metricdata.Gauge[int64]{DataPoints: randomNumbers(g, iv)}
			case 1:
				met.Data = metricdata.Gauge[float64]{DataPoints: randomNumbers(g, fv)}
			case 2:
				met.Data = metricdata.Sum[int64]{Temporality: temps[r.IntN(2)], IsMonotonic: r.IntN(2) == 0, DataPoints: randomNumbers(g, iv)}
			case 3:
				met.Data = metricdata.Sum[float64]{Temporality: temps[r.IntN(2)], IsMonotonic: r.IntN(2) == 0, DataPoints: randomNumbers(g, fv)}
			case 4:
				met.Data = metricdata.Histogram[float64]{Temporality: temps[r.IntN(2)], DataPoints: randomHistogram(g, fv)}
			case 5:
				met.Data = metricdata.Histogram[int64]{Temporality: temps[r.IntN(2)], DataPoints: randomHistogram(g, iv)}
			}
			sm.Metrics = append(sm.Metrics, met)
		}
		rm.ScopeMetrics = append(rm.ScopeMetrics, sm)
	}
	return rm
}

// checkWireIsTheSDKs: the wire encoding of rm decodes (protobuf-go, which
// checks UTF-8) to the request the SDK's exporter sends for clean (rm with
// every string made UTF-8), equal field by field and again byte for byte
// once both are marshalled deterministically.
func checkWireIsTheSDKs(t *testing.T, sdk func(*metricdata.ResourceMetrics) ([]byte, error), rm, clean *metricdata.ResourceMetrics) {
	t.Helper()
	if !wireEncodable(rm) {
		t.Fatal("not wire-encodable")
	}
	wantB, err := sdk(clean)
	if err != nil {
		t.Fatalf("the SDK's exporter: %v", err)
	}
	var want, got colmetricpb.ExportMetricsServiceRequest
	if err := proto.Unmarshal(wantB, &want); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(appendMetricsRequest([]byte("kept"), rm)[len("kept"):], &got); err != nil {
		t.Fatalf("the wire request does not decode: %v", err)
	}
	if !proto.Equal(&want, &got) {
		t.Fatalf("wire request (-sdk +wire):\n%s", cmp.Diff(&want, &got, protocmp.Transform()))
	}
	det := proto.MarshalOptions{Deterministic: true}
	a, errA := det.Marshal(&want)
	b, errB := det.Marshal(&got)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Fatalf("re-marshalled requests differ (%d and %d bytes; %v, %v)", len(a), len(b), errA, errB)
	}
}

// FuzzWireIsTheSDKs compares the wire encoding with the SDK's exporter's
// request for random collections (seeded by the fuzzer): NaN, ±Inf, -0,
// int64 and uint64 extremes, every attribute kind with empty and nested
// values, empty keys, strings that are not UTF-8 (sent with U+FFFD; the
// SDK refused them) and lengths on the varint edges. The 300 seeds run
// in go test (about a second); make fuzz explores further.
func FuzzWireIsTheSDKs(f *testing.F) {
	for i := range uint64(300) {
		f.Add(i, uint64(33))
	}
	sdk := sdkBodies(f)
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		rm := (&randomMetrics{r: rand.New(rand.NewPCG(s1, s2))}).metrics()
		clean := (&randomMetrics{r: rand.New(rand.NewPCG(s1, s2)), clean: true}).metrics()
		checkWireIsTheSDKs(t, sdk, rm, clean)
	})
}

// Strings whose lengths, and the messages' around them, need 1 to 4 bytes
// of varint, up to 3 MiB; the fixture is checked the same way.
func TestWireIsTheSDKsLengths(t *testing.T) {
	sdk := sdkBodies(t)
	big := strings.Repeat("z", 3<<20)
	for _, n := range []int{0, 1, 126, 127, 128, 16370, 16383, 16384, 2097140, 2097151, 2097152, 3 << 20} {
		rm := &metricdata.ResourceMetrics{Resource: resource.Empty(), ScopeMetrics: []metricdata.ScopeMetrics{{
			Metrics: []metricdata.Metrics{{Name: big[:n], Data: metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{
				{Attributes: attribute.NewSet(attribute.String("k", big[:n])), Value: 1}}}}},
		}}}
		checkWireIsTheSDKs(t, sdk, rm, rm)
	}
	checkWireIsTheSDKs(t, sdk, wireFixture(t), wireFixture(t))
}

// A string that is not UTF-8 fails the SDK's export; the wire sends it
// with U+FFFD, and the request is valid proto3.
func TestWireInvalidUTF8(t *testing.T) {
	bad := func(host, v string) *metricdata.ResourceMetrics {
		return &metricdata.ResourceMetrics{Resource: resource.NewSchemaless(attribute.String("host.name", host)), ScopeMetrics: []metricdata.ScopeMetrics{{
			Scope: instrumentation.Scope{Name: "s"},
			Metrics: []metricdata.Metrics{{Name: "m", Data: metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{
				{Attributes: attribute.NewSet(attribute.String("k", v)), Value: 1}}}}},
		}}}
	}
	sdk := sdkBodies(t)
	if _, err := sdk(bad("node\xff", "\xc3(")); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("the SDK's exporter: %v, want its UTF-8 error", err)
	}
	checkWireIsTheSDKs(t, sdk, bad("node\xff", "\xc3("), bad("node\uFFFD", "\uFFFD("))
}

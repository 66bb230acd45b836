package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// TestCollectorRoundTrip starts the real collector, sends it a round of
// metrics (a sum, a gauge and a histogram over OTLP/HTTP JSON, a gauge over
// OTLP/gRPC on TCP and another on its Unix socket) and a log record (OTLP/HTTP
// JSON), stops it, starts it again on the same ports and socket, sends a
// second round, and reads both rounds back from its files.
func TestCollectorRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the test collector (minutes with a cold build cache) and runs it")
	}
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	c := StartCollector(t, WithCollectorSocket(sock))
	grpcAddr, httpURL := c.GRPCEndpoint(), c.HTTPEndpoint()
	const perRound = 5
	var wantPoints []CollectedPoint
	var wantLogs []CollectedLog
	for round := int64(1); round <= 2; round++ {
		if round == 2 {
			c.Stop(t)
			c.Start(t)
			if c.GRPCEndpoint() != grpcAddr || c.HTTPEndpoint() != httpURL || c.Socket() != sock {
				t.Fatalf("restarted on %s %s %s, want %s %s %s", c.GRPCEndpoint(), c.HTTPEndpoint(), c.Socket(), grpcAddr, httpURL, sock)
			}
		}
		ts := uint64(1_800_000_000_000_000_000) + uint64(round)*1_000_000_000
		start := uint64(1_700_000_000_000_000_000)
		res := map[string]string{"service.name": "statsagent", "round": fmt.Sprint(round)}
		postOTLP(t, c.HTTPEndpoint()+"/v1/metrics", fmt.Sprintf(metricsJSON, round, start, ts, 1.5*float64(round), ts, round*1024, start, ts))
		postOTLP(t, c.HTTPEndpoint()+"/v1/logs", fmt.Sprintf(logsJSON, round, ts, ts, round))
		exportGauge(t, c.GRPCEndpoint(), "test.grpc", round, ts)
		exportGauge(t, "unix://"+c.Socket(), "test.grpc.unix", round, ts)

		grpcRes := map[string]string{"service.name": "statsagent", "round": fmt.Sprint(round), "via": "grpc"}
		wantPoints = append(wantPoints,
			CollectedPoint{Metric: "test.cpu.time", Description: "CPU time", Unit: "s", Type: "sum", Temporality: "cumulative", Monotonic: true,
				Attributes: map[string]string{"cpu.mode": "user"}, Resource: res, Scope: "testenv",
				Value: 1.5 * float64(round), StartUnixNano: start, TimeUnixNano: ts},
			CollectedPoint{Metric: "test.memory.usage", Unit: "By", Type: "gauge", Resource: res, Scope: "testenv",
				Value: float64(round * 1024), Int: true, TimeUnixNano: ts},
			CollectedPoint{Metric: "test.latency", Unit: "s", Type: "histogram", Temporality: "delta", Resource: res, Scope: "testenv",
				Value: 0.625, Count: 3, BucketCounts: []uint64{1, 2}, ExplicitBounds: []float64{0.25}, StartUnixNano: start, TimeUnixNano: ts},
			CollectedPoint{Metric: "test.grpc", Unit: "1", Type: "gauge", Attributes: map[string]string{"k": "v"}, Resource: grpcRes, Scope: "testenv",
				Value: float64(round), Int: true, TimeUnixNano: ts},
			CollectedPoint{Metric: "test.grpc.unix", Unit: "1", Type: "gauge", Attributes: map[string]string{"k": "v"}, Resource: grpcRes, Scope: "testenv",
				Value: float64(round), Int: true, TimeUnixNano: ts},
		)
		wantLogs = append(wantLogs, CollectedLog{EventName: "test.usage", Body: fmt.Sprintf("round %d", round),
			Attributes: map[string]any{"s": "a", "i": round, "d": 0.25, "b": true, "list": []any{"x", int64(2)}, "map": map[string]any{"k": "v"}},
			Resource:   res, Scope: "testenv", SeverityNumber: 9, SeverityText: "INFO", TimeUnixNano: ts, ObservedUnixNano: ts})

		n := int(round)
		c.WaitMetrics(t, 10*time.Second, func(p []CollectedPoint) bool { return len(p) >= n*perRound })
		c.WaitLogs(t, 10*time.Second, func(l []CollectedLog) bool { return len(l) >= n })
	}
	c.Stop(t)

	got := c.Metrics(t)
	sortPoints := func(p []CollectedPoint) {
		sort.SliceStable(p, func(i, j int) bool {
			if p[i].TimeUnixNano != p[j].TimeUnixNano {
				return p[i].TimeUnixNano < p[j].TimeUnixNano
			}
			return p[i].Metric < p[j].Metric
		})
	}
	sortPoints(got)
	sortPoints(wantPoints)
	if diff := cmp.Diff(wantPoints, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantLogs, c.Logs(t), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
}

// metricsJSON is an OTLP/HTTP JSON metrics request: round, start, time,
// the sum's value, time, the gauge's value, start, time.
const metricsJSON = `{"resourceMetrics":[{"resource":{"attributes":[
 {"key":"service.name","value":{"stringValue":"statsagent"}},{"key":"round","value":{"intValue":"%d"}}]},
 "scopeMetrics":[{"scope":{"name":"testenv"},"metrics":[
  {"name":"test.cpu.time","description":"CPU time","unit":"s","sum":{"aggregationTemporality":2,"isMonotonic":true,
   "dataPoints":[{"attributes":[{"key":"cpu.mode","value":{"stringValue":"user"}}],"startTimeUnixNano":"%d","timeUnixNano":"%d","asDouble":%g}]}},
  {"name":"test.memory.usage","unit":"By","gauge":{"dataPoints":[{"timeUnixNano":"%d","asInt":"%d"}]}},
  {"name":"test.latency","unit":"s","histogram":{"aggregationTemporality":1,
   "dataPoints":[{"startTimeUnixNano":"%d","timeUnixNano":"%d","count":"3","sum":0.625,"bucketCounts":["1","2"],"explicitBounds":[0.25]}]}}
 ]}]}]}`

// logsJSON is an OTLP/HTTP JSON logs request: round, time, observed time,
// round.
const logsJSON = `{"resourceLogs":[{"resource":{"attributes":[
 {"key":"service.name","value":{"stringValue":"statsagent"}},{"key":"round","value":{"intValue":"%[1]d"}}]},
 "scopeLogs":[{"scope":{"name":"testenv"},"logRecords":[{"timeUnixNano":"%[2]d","observedTimeUnixNano":"%[3]d",
  "severityNumber":9,"severityText":"INFO","eventName":"test.usage","body":{"stringValue":"round %[4]d"},
  "attributes":[{"key":"s","value":{"stringValue":"a"}},{"key":"i","value":{"intValue":"%[4]d"}},
   {"key":"d","value":{"doubleValue":0.25}},{"key":"b","value":{"boolValue":true}},
   {"key":"list","value":{"arrayValue":{"values":[{"stringValue":"x"},{"intValue":"2"}]}}},
   {"key":"map","value":{"kvlistValue":{"values":[{"key":"k","value":{"stringValue":"v"}}]}}}]}]}]}]}`

// postOTLP posts an OTLP/HTTP JSON request and fails the test unless the
// collector answers 200.
func postOTLP(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, resp.Status, b)
	}
}

// rawCodec passes already encoded protobuf messages through gRPC; named
// "proto", so the request's content type is application/grpc+proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// exportGauge sends one integer gauge point to target's OTLP/gRPC metrics
// service (opentelemetry.proto.collector.metrics.v1.MetricsService/Export),
// with resource attributes service.name=statsagent, round and via=grpc, the
// point's attribute k=v, encoded by hand with protowire: the main module does
// not depend on the OTLP protos.
func exportGauge(t *testing.T, target, name string, value int64, ts uint64) {
	t.Helper()
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
	}
	str := func(b []byte, num protowire.Number, s string) []byte { return msg(b, num, []byte(s)) }
	kv := func(k, v string) []byte { return msg(str(nil, 1, k), 2, str(nil, 1, v)) } // KeyValue{key, AnyValue{string_value}}
	var dp []byte                                                                    // NumberDataPoint
	dp = msg(dp, 7, kv("k", "v"))
	dp = protowire.AppendFixed64(protowire.AppendTag(dp, 3, protowire.Fixed64Type), ts)
	dp = protowire.AppendFixed64(protowire.AppendTag(dp, 6, protowire.Fixed64Type), uint64(value))
	metric := str(nil, 1, name)
	metric = str(metric, 3, "1")
	metric = msg(metric, 5, msg(nil, 1, dp)) // gauge{data_points}
	scope := msg(msg(nil, 1, str(nil, 1, "testenv")), 2, metric)
	var res []byte
	for _, a := range [][2]string{{"service.name", "statsagent"}, {"round", fmt.Sprint(value)}, {"via", "grpc"}} {
		res = msg(res, 1, kv(a[0], a[1]))
	}
	req := msg(nil, 1, msg(msg(nil, 1, res), 2, scope))

	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp []byte
	if err := conn.Invoke(ctx, "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Fatalf("OTLP/gRPC export to %s: %v", target, err)
	}
	// ExportMetricsServiceResponse: partial_success (1) is empty unless the
	// collector rejected points.
	for b := resp; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("OTLP/gRPC export to %s: response %x: %v", target, resp, protowire.ParseError(n))
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatalf("OTLP/gRPC export to %s: response %x: %v", target, resp, protowire.ParseError(m))
		}
		if num == 1 && m > 1 {
			t.Errorf("OTLP/gRPC export to %s: partial success %x", target, b[:m])
		}
		b = b[m:]
	}
}

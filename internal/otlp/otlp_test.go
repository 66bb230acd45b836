package otlp

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/telemetry"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeCollector is an in-process OTLP gRPC receiver on a Unix socket: it
// keeps what it is sent, and can refuse (Unavailable) or hang.
type fakeCollector struct {
	colmetrics.UnimplementedMetricsServiceServer
	collogs.UnimplementedLogsServiceServer

	mu      sync.Mutex
	metrics []*colmetrics.ExportMetricsServiceRequest
	events  []string // each log record's event name and actor, as "name/actor"
	refuse  bool
	hang    chan struct{} // non-nil: every call waits on it
}

func (f *fakeCollector) Export(ctx context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	if err := f.gate(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metrics = append(f.metrics, proto.Clone(req).(*colmetrics.ExportMetricsServiceRequest))
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

func (f *fakeCollector) gate(ctx context.Context) error {
	f.mu.Lock()
	refuse, hang := f.refuse, f.hang
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if refuse {
		return status.Error(codes.Unavailable, "refusing")
	}
	return nil
}

// logsServer adapts fakeCollector to the logs service (its Export has the
// metrics service's name).
type logsServer struct {
	collogs.UnimplementedLogsServiceServer
	f *fakeCollector
}

func (l logsServer) Export(ctx context.Context, req *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	if err := l.f.gate(ctx); err != nil {
		return nil, err
	}
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	for _, rl := range req.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			for _, r := range sl.GetLogRecords() {
				actor := ""
				for _, kv := range r.GetAttributes() {
					if kv.GetKey() == "actor" {
						actor = kv.GetValue().GetStringValue()
					}
				}
				l.f.events = append(l.f.events, r.GetEventName()+"/"+actor)
			}
		}
	}
	return &collogs.ExportLogsServiceResponse{}, nil
}

// serve starts f on socket; the returned stop closes the server.
func (f *fakeCollector) serve(t *testing.T, socket string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	colmetrics.RegisterMetricsServiceServer(srv, f)
	collogs.RegisterLogsServiceServer(srv, logsServer{f: f})
	go srv.Serve(ln)
	var once sync.Once
	stop = func() { once.Do(srv.Stop) }
	t.Cleanup(stop)
	return stop
}

func (f *fakeCollector) got() (metricExports int, events []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.metrics), slices.Clone(f.events)
}

// startPipeline runs a Pipeline to endpoint with one counter and returns
// it, the counter and an emit of one event of actor.
func startPipeline(t *testing.T, cfg Config) (*Pipeline, *prometheus.Registry, func(actor, kind string)) {
	t.Helper()
	cfg.Resource = []attribute.KeyValue{attribute.String("service.name", "statsagent")}
	p, err := New(cfg, discard())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collectors()...)
	c, err := p.Meters().Meter("test").Int64Counter("test.counter")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1, metric.WithAttributes(attribute.String("k", "v")))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("pipeline shutdown: %v", err)
		}
	})
	logger := p.Loggers().Logger("test")
	emit := func(actor, kind string) {
		var r otellog.Record
		r.SetEventName("test.event")
		r.AddAttributes(attribute.String("actor", actor), attribute.String(kindKey, kind))
		logger.Emit(context.Background(), r)
	}
	return p, reg, emit
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEventsKeptWhileCollectorDown: events emitted while no collector
// listens are kept and sent once it is back, each exactly once; metrics
// exports that failed meanwhile are counted and superseded.
func TestEventsKeptWhileCollectorDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	p, reg, emit := startPipeline(t, Config{Endpoint: "unix://" + sock, Timeout: time.Second})
	for i := range 5 {
		emit(fmt.Sprint("a", i), "final")
		p.Swept()
	}
	waitFor(t, "a failed metrics export and a kept event batch", func() bool {
		return testutil.ToFloat64(p.exports.WithLabelValues("metrics", "failed")) >= 1 && testutil.ToFloat64(p.exports.WithLabelValues("logs", "retry")) >= 1
	})
	f := &fakeCollector{}
	f.serve(t, sock)
	emit("a5", "periodic")
	p.Swept()
	waitFor(t, "every event delivered", func() bool { _, ev := f.got(); return len(ev) == 6 })
	waitFor(t, "a metrics export", func() bool { p.Swept(); n, _ := f.got(); return n >= 1 })
	_, events := f.got()
	want := []string{"test.event/a0", "test.event/a1", "test.event/a2", "test.event/a3", "test.event/a4", "test.event/a5"}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(p.queue.sentC.WithLabelValues("final")); got != 5 {
		t.Errorf("finals sent: %v, want 5", got)
	}
	if n, err := testutil.GatherAndCount(reg, metricEventsDropped); err != nil || n != 0 {
		t.Errorf("dropped series: %d (%v), want none", n, err)
	}
}

// TestNeverBlocks: a collector that hangs costs the emitter and Swept
// nothing; each export ends at its timeout, and a batch that timed out is
// counted uncertain, never sent again; the queue drops what is over its
// bound, finals last.
func TestNeverBlocks(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	f := &fakeCollector{hang: make(chan struct{})}
	f.serve(t, sock)
	p, _, emit := startPipeline(t, Config{Endpoint: "unix://" + sock, Timeout: 300 * time.Millisecond, QueueRecords: 8})
	start := time.Now()
	for i := range 100 {
		kind := "periodic"
		if i%10 == 0 {
			kind = "final"
		}
		emit(fmt.Sprint("a", i), kind)
		p.Swept()
	}
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("100 emits and Swept calls took %v with a hung collector", took)
	}
	waitFor(t, "a timed-out batch counted uncertain", func() bool {
		return testutil.ToFloat64(p.queue.dropped.WithLabelValues("periodic", "uncertain"))+testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "uncertain")) >= 1
	})
	full := testutil.ToFloat64(p.queue.dropped.WithLabelValues("periodic", "queue-full"))
	if full < 80 {
		t.Errorf("periodic events dropped as queue-full: %v, want at least 80 (6 of 8 places for them)", full)
	}
	// Finals have the last quarter to themselves: 2 more of them are kept
	// than periodic events could have left room for.
	if got := testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "queue-full")); got > 7 {
		t.Errorf("finals dropped as queue-full: %v, want at most 7 of 10 (the queue's last quarter is theirs)", got)
	}
	close(f.hang)
	_, events := f.got()
	seen := map[string]bool{}
	for _, e := range events {
		if seen[e] {
			t.Errorf("event %s delivered twice", e)
		}
		seen[e] = true
	}
}

// TestHTTPProtobuf: the HTTP/protobuf transport delivers metrics and events
// to /v1/metrics and /v1/logs, and a 503 keeps the events for later.
func TestHTTPProtobuf(t *testing.T) {
	var mu sync.Mutex
	paths := map[string]int{}
	unavailable := true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		if unavailable && r.URL.Path == "/v1/logs" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		paths[r.URL.Path]++
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p, _, emit := startPipeline(t, Config{Endpoint: "http://" + ln.Addr().String(), Protocol: ProtocolHTTP, Timeout: time.Second})
	emit("a", "final")
	p.Swept()
	waitFor(t, "a kept batch after a 503", func() bool { return testutil.ToFloat64(p.exports.WithLabelValues("logs", "retry")) >= 1 })
	mu.Lock()
	unavailable = false
	mu.Unlock()
	waitFor(t, "the event and the metrics delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return paths["/v1/logs"] == 1 && paths["/v1/metrics"] >= 1
	})
}

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Endpoint
		wantErr string
	}{
		{in: "http://127.0.0.1:4317", want: Endpoint{Scheme: "http", Host: "127.0.0.1:4317"}},
		{in: "https://collector.example:4318", want: Endpoint{Scheme: "https", Host: "collector.example:4318"}},
		{in: "http://[::1]:4317/", want: Endpoint{Scheme: "http", Host: "[::1]:4317"}},
		{in: "unix:///run/otel/otlp.sock", want: Endpoint{Scheme: "unix", Path: "/run/otel/otlp.sock"}},
		{in: "127.0.0.1:4317", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1:4318/v1/metrics", wantErr: "want http://HOST:PORT"},
		{in: "unix://relative/path", wantErr: "want unix:///ABSOLUTE/PATH"},
		{in: "grpc://127.0.0.1:4317", wantErr: "want http://HOST:PORT"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEndpoint(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestHTTPTimeoutNotResent: over HTTP/protobuf, a batch whose export timed
// out after the collector read it is counted uncertain and never sent
// again (the exporter calls such timeouts retry-able).
func TestHTTPTimeoutNotResent(t *testing.T) {
	var mu sync.Mutex
	posts := 0
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/v1/logs" {
			return
		}
		mu.Lock()
		posts++
		mu.Unlock()
		<-release // answers only after the exporter gave up
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	p, _, emit := startPipeline(t, Config{Endpoint: srv.URL, Protocol: ProtocolHTTP, Timeout: 300 * time.Millisecond})
	emit("a", "final")
	waitFor(t, "the timed-out batch counted uncertain", func() bool {
		return testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "uncertain")) == 1
	})
	time.Sleep(time.Second) // a resend would come within the backoff
	mu.Lock()
	defer mu.Unlock()
	if posts != 1 {
		t.Errorf("the batch was posted %d times, want 1", posts)
	}
}

// TestBatchTooLarge: a collector that refuses a batch as too large
// (ResourceExhausted without RetryInfo) gets it again in halves, each
// event once; none is dropped.
func TestBatchTooLarge(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	f := &fakeCollector{}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(1500))
	colmetrics.RegisterMetricsServiceServer(srv, f)
	collogs.RegisterLogsServiceServer(srv, logsServer{f: f})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	p, _, emit := startPipeline(t, Config{Endpoint: "unix://" + sock, Timeout: time.Second})
	var want []string
	for i := range 20 {
		emit(fmt.Sprint("a", i), "final")
		want = append(want, fmt.Sprint("test.event/a", i))
	}
	waitFor(t, "every event delivered", func() bool { _, ev := f.got(); return len(ev) >= 20 })
	_, events := f.got()
	slices.Sort(events)
	slices.Sort(want)
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// The collector keeps a batch before the exporter has its answer.
	waitFor(t, "20 finals counted sent", func() bool { return testutil.ToFloat64(p.queue.sentC.WithLabelValues("final")) == 20 })
}

// TestSplitMetrics: an export of more points than the bound is cut into
// parts of at most the bound, every point once, in order.
func TestSplitMetrics(t *testing.T) {
	sum := func(n int) metricdata.Sum[int64] {
		s := metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}
		for i := range n {
			s.DataPoints = append(s.DataPoints, metricdata.DataPoint[int64]{Value: int64(i)})
		}
		return s
	}
	rm := &metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{
		{Name: "a", Data: sum(5)}, {Name: "b", Data: sum(0)}, {Name: "c", Data: sum(7)},
	}}}}
	var got []string
	for _, part := range splitMetrics(rm, 4) {
		n := 0
		var names []string
		for _, sm := range part.ScopeMetrics {
			for _, m := range sm.Metrics {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					names = append(names, fmt.Sprint(m.Name, dp.Value))
				}
				n += points(m.Data)
			}
		}
		if n > 4 {
			t.Errorf("a part of %d points", n)
		}
		got = append(got, strings.Join(names, " "))
	}
	want := []string{"a0 a1 a2 a3", "a4 c0 c1 c2", "c3 c4 c5 c6"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parts (-want +got):\n%s", diff)
	}
}

// TestRegistryPipelineMetrics: the pipeline's Prometheus metrics are the
// registry's sandboxstats_agent_otlp_ ones.
func TestRegistryPipelineMetrics(t *testing.T) {
	reg, err := telemetry.Load("../../docs/telemetry/registry.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range reg.PrometheusNames() {
		if strings.HasPrefix(n, "sandboxstats_agent_otlp_") {
			want = append(want, n)
		}
	}
	p, err := New(Config{Endpoint: "unix:///nonexistent.sock"}, discard())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range p.Collectors() {
		ch := make(chan *prometheus.Desc, 8)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			s := d.String() // Desc{fqName: "name", ...}
			name, _, _ := strings.Cut(strings.TrimPrefix(s, `Desc{fqName: "`), `"`)
			got = append(got, name)
		}
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pipeline metrics (-registry +code):\n%s", diff)
	}
}

// TestTLS: an https endpoint is verified with --otlp-ca-file (and refused
// without it: the system's roots do not know a test certificate); TLS
// files with a plaintext endpoint are refused.
func TestTLS(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got[r.URL.Path]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.URL
	p, _, emit := startPipeline(t, Config{Endpoint: endpoint, Protocol: ProtocolHTTP, CAFile: ca, Timeout: time.Second})
	emit("a", "final")
	p.Swept()
	waitFor(t, "events and metrics over TLS", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["/v1/logs"] == 1 && got["/v1/metrics"] >= 1
	})

	unverified, _, emit2 := startPipeline(t, Config{Endpoint: endpoint, Protocol: ProtocolHTTP, Timeout: time.Second})
	emit2("b", "final")
	waitFor(t, "the unverified server's export refused", func() bool {
		return testutil.ToFloat64(unverified.exports.WithLabelValues("logs", "failed")) >= 1
	})
	mu.Lock()
	defer mu.Unlock()
	if got["/v1/logs"] != 1 {
		t.Errorf("a server the CA does not verify got events: %v", got)
	}
	if _, err := New(Config{Endpoint: "http://127.0.0.1:4318", CAFile: ca}, discard()); err == nil {
		t.Error("a CA file with a plaintext endpoint was accepted")
	}
}

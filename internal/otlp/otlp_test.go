package otlp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
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
// it, the counter and an emit of one event of actor (its log.record.uid:
// the actor).
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
		r.AddAttributes(attribute.String("actor", actor), attribute.String(kindKey, kind), attribute.String(uidKey, actor))
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
// kept and sent again, counted resent; the queue drops what is over its
// bound, finals last. Once the collector answers, what was kept is
// delivered: twice at most where a resend is counted.
func TestNeverBlocks(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	f := &fakeCollector{hang: make(chan struct{})}
	f.serve(t, sock)
	p, reg, emit := startPipeline(t, Config{Endpoint: "unix://" + sock, Timeout: 300 * time.Millisecond, QueueRecords: 8})
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
	waitFor(t, "a timed-out batch sent again", func() bool {
		return testutil.ToFloat64(p.queue.resent.WithLabelValues("periodic"))+testutil.ToFloat64(p.queue.resent.WithLabelValues("final")) >= 1
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
	kept, _ := p.queue.size()
	close(f.hang)
	waitFor(t, "the kept events delivered", func() bool { n, _ := p.queue.size(); return n == 0 })
	sent := testutil.ToFloat64(p.queue.sentC.WithLabelValues("periodic")) + testutil.ToFloat64(p.queue.sentC.WithLabelValues("final"))
	resent := testutil.ToFloat64(p.queue.resent.WithLabelValues("periodic")) + testutil.ToFloat64(p.queue.resent.WithLabelValues("final"))
	_, events := f.got()
	seen := map[string]int{}
	for _, e := range events {
		seen[e]++
	}
	if len(seen) != kept || sent != float64(kept) {
		t.Errorf("%d distinct events delivered, %v counted sent; want the %d kept", len(seen), sent, kept)
	}
	if dups := len(events) - len(seen); float64(dups) > resent {
		t.Errorf("%d events delivered twice, more than the %v counted resent", dups, resent)
	}
	if n, err := testutil.GatherAndCount(reg, metricEventsDropped); err != nil || n != 2 {
		t.Errorf("dropped series: %d (%v), want 2 (queue-full, by kind)", n, err)
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

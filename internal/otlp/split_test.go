package otlp

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
)

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

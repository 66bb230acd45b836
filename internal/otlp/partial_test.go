package otlp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// newFlushed returns a Pipeline to cfg's endpoint that exports only when
// the test calls Flush (no Run: each export is the test's), with one
// counter of points data points, and an emit of n final events (actor
// a<i>, log.record.uid uid-a<i>).
func newFlushed(t *testing.T, cfg Config, points int) (*Pipeline, func(n int)) {
	t.Helper()
	cfg.Resource = []attribute.KeyValue{attribute.String("service.name", "statsagent")}
	p, err := New(cfg, discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.closeConn)
	c, err := p.Meters().Meter("test").Int64Counter("test.counter")
	if err != nil {
		t.Fatal(err)
	}
	for i := range points {
		c.Add(context.Background(), 1, metric.WithAttributes(attribute.Int("i", i)))
	}
	logger := p.Loggers().Logger("test")
	emit := func(n int) {
		for i := range n {
			var r otellog.Record
			r.SetEventName("test.event")
			r.AddAttributes(attribute.String("actor", fmt.Sprint("a", i)), attribute.String(kindKey, "final"), attribute.String(uidKey, fmt.Sprint("uid-a", i)))
			logger.Emit(context.Background(), r)
		}
	}
	return p, emit
}

// partialCollector answers every export OK with a partial_success: up to
// rejected of its items rejected, and msg (an OTLP warning when rejected
// is 0). It counts what it received.
type partialCollector struct {
	colmetrics.UnimplementedMetricsServiceServer
	rejected int64
	msg      string

	mu             sync.Mutex
	points, events int
}

func metricPoints(req *colmetrics.ExportMetricsServiceRequest) int {
	n := 0
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				n += len(m.GetSum().GetDataPoints()) + len(m.GetGauge().GetDataPoints()) + len(m.GetHistogram().GetDataPoints())
			}
		}
	}
	return n
}

func logRecords(req *collogs.ExportLogsServiceRequest) int {
	n := 0
	for _, rl := range req.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			n += len(sl.GetLogRecords())
		}
	}
	return n
}

func (f *partialCollector) Export(_ context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := metricPoints(req)
	f.points += n
	return &colmetrics.ExportMetricsServiceResponse{PartialSuccess: &colmetrics.ExportMetricsPartialSuccess{
		RejectedDataPoints: min(f.rejected, int64(n)), ErrorMessage: f.msg}}, nil
}

func (f *partialCollector) logs(req *collogs.ExportLogsServiceRequest) *collogs.ExportLogsServiceResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := logRecords(req)
	f.events += n
	return &collogs.ExportLogsServiceResponse{PartialSuccess: &collogs.ExportLogsPartialSuccess{
		RejectedLogRecords: min(f.rejected, int64(n)), ErrorMessage: f.msg}}
}

type partialLogs struct {
	collogs.UnimplementedLogsServiceServer
	f *partialCollector
}

func (l partialLogs) Export(_ context.Context, req *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	return l.f.logs(req), nil
}

// serveGRPC serves f over gRPC on a Unix socket and returns its endpoint.
func (f *partialCollector) serveGRPC(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "otlp.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	colmetrics.RegisterMetricsServiceServer(srv, f)
	collogs.RegisterLogsServiceServer(srv, partialLogs{f: f})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return "unix://" + sock
}

// serveHTTP serves f over HTTP/protobuf and returns its endpoint.
func (f *partialCollector) serveHTTP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var resp proto.Message
		switch r.URL.Path {
		case "/v1/logs":
			var req collogs.ExportLogsServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			resp = f.logs(&req)
		case "/v1/metrics":
			var req colmetrics.ExportMetricsServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			resp, _ = f.Export(r.Context(), &req)
		}
		b, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPartialSuccess: a collector answering partial_success (a warning
// with 0 rejected, which OTLP counts accepted, or N rejected) took the
// export: the events are counted sent but for the N rejected, and the
// metrics export goes on through all its parts.
func TestPartialSuccess(t *testing.T) {
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		for _, tc := range []struct {
			name     string
			rejected int64
		}{
			{"a warning, none rejected", 0},
			{"3 rejected", 3},
		} {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				f := &partialCollector{rejected: tc.rejected, msg: "dropped some attributes"}
				ep := f.serveGRPC
				if proto == ProtocolHTTP {
					ep = f.serveHTTP
				}
				var settled settledLog
				p, emit := newFlushed(t, Config{Endpoint: ep(t), Protocol: proto, Timeout: 5 * time.Second, Settled: settled.add}, 2501)
				emit(10)
				p.Flush(context.Background())
				if diff := cmp.Diff(uids(0, 10), settled.got()); diff != "" {
					t.Errorf("settled, the rejected share included (-want +got):\n%s", diff)
				}
				sent := testutil.ToFloat64(p.queue.sentC.WithLabelValues("final"))
				dropped := testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "rejected"))
				if want := 10 - float64(tc.rejected); sent != want || dropped != float64(tc.rejected) {
					t.Errorf("finals sent %v, dropped as rejected %v; want %v sent, %d rejected", sent, dropped, want, tc.rejected)
				}
				f.mu.Lock()
				defer f.mu.Unlock()
				if f.points != 2501 || f.events != 10 {
					t.Errorf("the collector got %d of 2501 points, %d of 10 events", f.points, f.events)
				}
			})
		}
	}
}

// cutCollector takes the first request whole, then closes its connection
// without answering (a collector that crashed, or a proxy that dropped
// it); it answers the next ones.
type cutCollector struct {
	collogs.UnimplementedLogsServiceServer
	mu    sync.Mutex
	calls int
	conns []net.Conn
}

func (c *cutCollector) took() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// cut counts a call and, for the first, closes every connection: it
// reports whether it did.
func (c *cutCollector) cut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls > 1 {
		return false
	}
	for _, conn := range c.conns {
		conn.Close()
	}
	return true
}

func (c *cutCollector) Export(ctx context.Context, _ *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	if !c.cut() {
		return &collogs.ExportLogsServiceResponse{}, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// trackingListener hands every connection it accepts to its collector.
type trackingListener struct {
	net.Listener
	c *cutCollector
}

func (l trackingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err == nil {
		l.c.mu.Lock()
		l.c.conns = append(l.c.conns, conn)
		l.c.mu.Unlock()
	}
	return conn, err
}

// TestCutAfterRequestResent: a collector that reads a batch whole, then
// drops the connection without answering (gRPC: Unavailable; HTTP: EOF),
// may have taken it: the batch stays queued, unsettled, and is sent again,
// counted resent; the collector gets it twice (the same log.record.uids).
func TestCutAfterRequestResent(t *testing.T) {
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		t.Run(proto, func(t *testing.T) {
			c := &cutCollector{}
			var endpoint string
			if proto == ProtocolGRPC {
				sock := filepath.Join(t.TempDir(), "otlp.sock")
				ln, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				collogs.RegisterLogsServiceServer(srv, c)
				go srv.Serve(trackingListener{Listener: ln, c: c})
				t.Cleanup(srv.Stop)
				endpoint = "unix://" + sock
			} else {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					if c.took() > 0 {
						c.cut() // counted; answered OK
						w.Header().Set("Content-Type", "application/x-protobuf")
						return
					}
					conn, _, err := w.(http.Hijacker).Hijack()
					if err != nil {
						t.Error(err)
						return
					}
					c.mu.Lock()
					c.conns = append(c.conns, conn)
					c.mu.Unlock()
					c.cut()
				}))
				t.Cleanup(srv.Close)
				endpoint = srv.URL
			}
			var settled settledLog
			p, emit := newFlushed(t, Config{Endpoint: endpoint, Protocol: proto, Timeout: 5 * time.Second, Settled: settled.add}, 0)
			emit(3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if !p.queue.drainOnce(ctx, p.sendEvents) {
				t.Fatal("drainOnce did not keep the batch of unknown outcome")
			}
			if n, _ := p.queue.size(); n != 3 || len(settled.got()) != 0 || c.took() != 1 {
				t.Fatalf("after the cut: %d of 3 finals queued, settled %v, collector took %d; want 3 queued, none settled, 1", n, settled.got(), c.took())
			}
			// Sent again (gRPC may first answer that it is reconnecting:
			// kept, not sent).
			for i := 0; p.queue.drainOnce(ctx, p.sendEvents); i++ {
				if i == 50 {
					t.Fatal("the batch was never sent again")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if n, _ := p.queue.size(); n != 0 {
				t.Errorf("%d finals still queued", n)
			}
			if got := c.took(); got != 2 {
				t.Errorf("the collector took the batch %d times, want 2", got)
			}
			for _, m := range []struct {
				name      string
				got, want float64
			}{
				{"resent", testutil.ToFloat64(p.queue.resent.WithLabelValues("final")), 3},
				{"sent", testutil.ToFloat64(p.queue.sentC.WithLabelValues("final")), 3},
				{"exports retry", testutil.ToFloat64(p.exports.WithLabelValues("logs", "retry")), 1},
				{"exports ok", testutil.ToFloat64(p.exports.WithLabelValues("logs", "ok")), 1},
				{"exports failed", testutil.ToFloat64(p.exports.WithLabelValues("logs", "failed")), 0},
				{"dropped uncertain", testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "uncertain")), 0},
			} {
				if m.got != m.want {
					t.Errorf("%s: %v, want %v", m.name, m.got, m.want)
				}
			}
			if diff := cmp.Diff(uids(0, 3), settled.got()); diff != "" {
				t.Errorf("settled after the resend (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNeverReachedKept: a batch that never reached a collector (nothing
// listening; a listener that closes each connection before the gRPC
// handshake) is kept, to be sent again.
func TestNeverReachedKept(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen func(t *testing.T, sock string)
	}{
		{"nothing listening", func(*testing.T, string) {}},
		{"closed before the handshake", func(t *testing.T, sock string) {
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					conn.Close()
				}
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "otlp.sock")
			tc.listen(t, sock)
			p, emit := newFlushed(t, Config{Endpoint: "unix://" + sock, Timeout: 2 * time.Second}, 0)
			emit(3)
			if !p.queue.drainOnce(context.Background(), p.sendEvents) {
				t.Error("drainOnce did not report the collector unreached")
			}
			if n, _ := p.queue.size(); n != 3 {
				t.Errorf("%d of 3 finals kept", n)
			}
		})
	}
}

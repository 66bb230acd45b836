package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// httpSeen is what an OTLP/HTTP server saw of a metrics request.
type httpSeen struct {
	Header  map[string]string // the headers an exporter sets
	Chunked bool
	Request *colmetricpb.ExportMetricsServiceRequest
}

// seenHTTP returns a server that keeps the last metrics request it saw and
// answers 200 with no body.
func seenHTTP(t *testing.T) (*httptest.Server, func() httpSeen) {
	var mu sync.Mutex
	var last httpSeen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				t.Errorf("gzip: %v", err)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			t.Errorf("read: %v", err)
		}
		seen := httpSeen{Header: map[string]string{}, Chunked: r.ContentLength == -1, Request: &colmetricpb.ExportMetricsServiceRequest{}}
		for _, k := range []string{"User-Agent", "Content-Type", "Content-Encoding", "Authorization", "X-Tenant", "Accept-Encoding"} {
			if v := r.Header.Get(k); v != "" {
				seen.Header[k] = v
			}
		}
		if err := proto.Unmarshal(b, seen.Request); err != nil {
			t.Errorf("request: %v", err)
		}
		mu.Lock()
		last = seen
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv, func() httpSeen {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// Over HTTP, the pipeline's metrics request is the SDK exporter's in the
// same environment: User-Agent (a header overrides it), headers, content
// type, OTEL_EXPORTER_OTLP_(METRICS_)COMPRESSION=gzip (review finding 3),
// and the body.
func TestHTTPSenderRequestIsTheSDKs(t *testing.T) {
	auth := map[string]string{"Authorization": "Bearer x", "X-Tenant": "t1"}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		headers map[string]string
		gzip    bool
	}{
		{name: "plain", headers: auth},
		{name: "no headers"},
		{name: "header overrides User-Agent", headers: map[string]string{"User-Agent": "mine/1"}},
		{name: "COMPRESSION=gzip", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, headers: auth, gzip: true},
		{name: "METRICS_COMPRESSION=gzip", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": " gzip "}, gzip: true},
		{name: "METRICS_COMPRESSION=none wins", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "none"}},
		{name: "COMPRESSION=GZIP is none", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"} {
				t.Setenv(k, tc.env[k])
			}
			srv, last := seenHTTP(t)
			ctx := context.Background()
			rm := wireFixture(t)

			p, err := New(Config{Endpoint: srv.URL, Protocol: ProtocolHTTP, Headers: tc.headers, Timeout: 5 * time.Second}, discard())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.metricExp.Shutdown(ctx) })
			if err := p.metricExp.Export(ctx, rm); err != nil {
				t.Fatalf("wire: %v", err)
			}
			wire := last()

			sdk, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(srv.URL+"/v1/metrics"), otlpmetrichttp.WithHTTPClient(srv.Client()),
				otlpmetrichttp.WithHeaders(tc.headers), otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := sdk.Export(ctx, rm); err != nil {
				t.Fatalf("sdk: %v", err)
			}
			if diff := cmp.Diff(last(), wire, protocmp.Transform()); diff != "" {
				t.Errorf("request (-sdk +wire):\n%s", diff)
			}
			if gz := wire.Header["Content-Encoding"] == "gzip"; gz != tc.gzip {
				t.Errorf("gzipped: %v, want %v", gz, tc.gzip)
			}
		})
	}
}

// A 2xx answer is a success, decoded only when it is protobuf (review
// finding 1); another status is an error with the quoted head of the
// collector's body (finding 4). The SDK's exporter agrees on each
// (success, partial success or failure).
func TestHTTPSenderAnswers(t *testing.T) {
	partial, err := proto.Marshal(&colmetricpb.ExportMetricsServiceResponse{PartialSuccess: &colmetricpb.ExportMetricsPartialSuccess{RejectedDataPoints: 3, ErrorMessage: "dropped"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		status      int
		contentType string
		body        []byte
		wantErr     string // "" for a success
		wantPartial int64  // -1: not a partial success
	}{
		{name: "protobuf partial success", status: 200, contentType: "application/x-protobuf", body: partial, wantErr: "OTLP partial success: dropped (3 metric data points rejected)", wantPartial: 3},
		{name: "protobuf empty", status: 200, contentType: "application/x-protobuf", wantPartial: -1},
		{name: "no body", status: 200, wantPartial: -1},
		{name: "text", status: 200, contentType: "text/plain", body: []byte("OK"), wantPartial: -1},
		{name: "json", status: 200, contentType: "application/json", body: []byte(`{"partialSuccess":{"rejectedDataPoints":"3"}}`), wantPartial: -1},
		{name: "202 text", status: 202, contentType: "text/plain; charset=utf-8", body: []byte("accepted"), wantPartial: -1},
		{name: "protobuf that is not", status: 200, contentType: "application/x-protobuf", body: []byte("OK {}"), wantErr: "response: proto", wantPartial: -1},
		{name: "protobuf over 4 MiB", status: 200, contentType: "application/x-protobuf", body: make([]byte, 4<<20+1), wantErr: "response body too large: exceeded 4194304 bytes", wantPartial: -1},
		{name: "400 with a reason", status: 400, contentType: "text/plain", body: []byte("bad: field x\n"), wantErr: `400 Bad Request (body: "bad: field x")`, wantPartial: -1},
		{name: "413", status: 413, wantErr: `413 Request Entity Too Large (body: "")`, wantPartial: -1},
		{name: "500 long foreign body", status: 500, body: []byte("\x1b[31m" + strings.Repeat("x", 10<<10)), wantErr: `500 Internal Server Error (body: "\x1b[31mxxx`, wantPartial: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if tc.contentType != "" {
					w.Header().Set("Content-Type", tc.contentType)
				}
				w.WriteHeader(tc.status)
				w.Write(tc.body)
			}))
			defer srv.Close()
			ctx := context.Background()
			rm := wireFixture(t)
			wire := &wireExporter{send: httpSender(srv.Client(), srv.URL+"/v1/metrics", nil, false)}
			werr := wire.Export(ctx, rm)
			sdk, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(srv.URL+"/v1/metrics"), otlpmetrichttp.WithHTTPClient(srv.Client()),
				otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{}))
			if err != nil {
				t.Fatal(err)
			}
			serr := sdk.Export(ctx, rm)

			if tc.wantErr == "" && werr != nil || tc.wantErr != "" && (werr == nil || !strings.Contains(werr.Error(), tc.wantErr)) {
				t.Fatalf("wire: %v, want %q", werr, tc.wantErr)
			}
			if werr != nil && len(werr.Error()) > 1<<10 {
				t.Errorf("wire error of %d bytes: the collector's body is not bounded", len(werr.Error()))
			}
			wn, wok := partialSuccess(werr)
			sn, sok := partialSuccess(serr)
			if wn != sn || wok != sok || (werr == nil) != (serr == nil) {
				t.Errorf("wire: %v (partial %v %d); the SDK's: %v (partial %v %d)", werr, wok, wn, serr, sok, sn)
			}
			if got := map[bool]int64{true: wn, false: -1}[wok && werr != nil]; got != tc.wantPartial {
				t.Errorf("partial success %d, want %d", got, tc.wantPartial)
			}
		})
	}
}

// After Shutdown, Export sends nothing and fails, as the SDK's exporter
// does (review finding 9).
func TestWireExporterShutdown(t *testing.T) {
	var mu sync.Mutex
	posts := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts++
		mu.Unlock()
	}))
	defer srv.Close()
	ctx := context.Background()
	sdk, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(srv.URL+"/v1/metrics"), otlpmetrichttp.WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	e := &wireExporter{sdk: sdk, send: httpSender(srv.Client(), srv.URL+"/v1/metrics", nil, false)}
	if err := e.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Export(ctx, wireFixture(t)); !errors.Is(err, errShutdown) {
		t.Fatalf("Export after Shutdown: %v, want %v", err, errShutdown)
	}
	if err := sdk.Export(ctx, wireFixture(t)); err == nil {
		t.Fatal("the SDK's Export after Shutdown: no error")
	}
	mu.Lock()
	defer mu.Unlock()
	if posts != 0 {
		t.Fatalf("%d requests after Shutdown", posts)
	}
}

// seenMetrics is a gRPC metrics service that keeps what it saw and answers
// answer.
type seenMetrics struct {
	colmetricpb.UnimplementedMetricsServiceServer
	answer *colmetricpb.ExportMetricsServiceResponse

	mu  sync.Mutex
	md  metadata.MD
	req *colmetricpb.ExportMetricsServiceRequest
}

func (s *seenMetrics) Export(ctx context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.md, s.req = md, req
	return s.answer, nil
}

func (s *seenMetrics) last() (metadata.MD, *colmetricpb.ExportMetricsServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.md, s.req
}

// Over gRPC, the wire request is the SDK exporter's on the same connection:
// the headers as metadata joined to the context's (review finding 7), the
// user agent, the request and its partial success. The content type is
// application/grpc+proto, not application/grpc (finding 6, documented).
func TestGRPCSenderIsTheSDKs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		headers  map[string]string
		outgoing metadata.MD
		answer   *colmetricpb.ExportMetricsServiceResponse
		partial  int64
	}{
		{name: "headers", headers: map[string]string{"Authorization": "Bearer x", "x-tenant": "t1"}, answer: &colmetricpb.ExportMetricsServiceResponse{}},
		{name: "headers joined to the context's", headers: map[string]string{"authorization": "Bearer x"}, outgoing: metadata.Pairs("x-caller", "c", "authorization", "other"),
			answer: &colmetricpb.ExportMetricsServiceResponse{}},
		{name: "no headers, the context's kept", outgoing: metadata.Pairs("x-caller", "c")},
		{name: "partial success", answer: &colmetricpb.ExportMetricsServiceResponse{PartialSuccess: &colmetricpb.ExportMetricsPartialSuccess{RejectedDataPoints: 2, ErrorMessage: "no"}}, partial: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := bufconn.Listen(1 << 20)
			srv := grpc.NewServer()
			seen := &seenMetrics{answer: tc.answer}
			colmetricpb.RegisterMetricsServiceServer(srv, seen)
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := context.Background()
			if tc.outgoing != nil {
				ctx = metadata.NewOutgoingContext(ctx, tc.outgoing)
			}
			rm := wireFixture(t)

			wire := &wireExporter{send: grpcSender(conn, tc.headers)}
			werr := wire.Export(ctx, rm)
			wmd, wreq := seen.last()
			sdk, err := otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithGRPCConn(conn), otlpmetricgrpc.WithHeaders(tc.headers),
				otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}))
			if err != nil {
				t.Fatal(err)
			}
			serr := sdk.Export(ctx, rm)
			smd, sreq := seen.last()

			if got, want := wmd.Get("content-type"), []string{"application/grpc+proto"}; !cmp.Equal(got, want) {
				t.Errorf("wire content-type %q, want %q", got, want)
			}
			if got, want := smd.Get("content-type"), []string{"application/grpc"}; !cmp.Equal(got, want) {
				t.Errorf("the SDK's content-type %q, want %q", got, want)
			}
			wmd.Delete("content-type")
			smd.Delete("content-type")
			if diff := cmp.Diff(smd, wmd); diff != "" {
				t.Errorf("metadata (-sdk +wire):\n%s", diff)
			}
			if diff := cmp.Diff(sreq, wreq, protocmp.Transform()); diff != "" {
				t.Errorf("request (-sdk +wire):\n%s", diff)
			}
			wn, wok := partialSuccess(werr)
			sn, sok := partialSuccess(serr)
			if wn != tc.partial || sn != tc.partial || wok != sok || (werr == nil) != (tc.partial == 0) {
				t.Errorf("wire: %v (%d); the SDK's: %v (%d); want %d rejected", werr, wn, serr, sn, tc.partial)
			}
		})
	}
}

// gzipped is gzip's: it reads back as the body.
func TestGzipped(t *testing.T) {
	body := appendMetricsRequest(nil, wireFixture(t))
	for range 2 { // the second from the pool
		z, err := gzipped(body)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(z))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("gunzipped %d bytes (%v), want the %d of the body", len(got), err, len(body))
		}
	}
}

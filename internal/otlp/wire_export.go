package otlp

// This file sends the metrics encoded by wire.go, over the pipeline's gRPC
// connection or its HTTP client, as the SDK's exporters would (same
// method or path, headers, User-Agent, gzip, answer handling and bounds;
// retries off; wire_export_test.go compares them); a collection wire.go
// does not encode goes to the SDK's exporter unchanged.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// metricsExportMethod is OTLP's gRPC method for metrics.
const metricsExportMethod = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

// Bounds of the SDK's exporters (otlpmetric*/internal/oconf): a request
// over maxRequestBytes is refused before it is sent; an OTLP/HTTP answer
// over maxResponseBytes is an error, never decoded cut.
const (
	maxRequestBytes  = 64 << 20
	maxResponseBytes = 4 << 20
)

// httpUserAgent is the User-Agent of the SDK's OTLP/HTTP metrics exporter.
var httpUserAgent = "OTel Go OTLP over HTTP/protobuf metrics exporter/" + otlpmetrichttp.Version()

// metricsExporter is what the pipeline asks of its metrics exporter.
type metricsExporter interface {
	Export(ctx context.Context, rm *metricdata.ResourceMetrics) error
	Shutdown(ctx context.Context) error
}

// wireExporter encodes a collection with appendMetricsRequest and sends it
// with send; sdk (the SDK's exporter on the same transport) takes what
// wireExporter does not encode, and is shut down with it.
type wireExporter struct {
	sdk  sdkmetric.Exporter
	send func(ctx context.Context, body []byte) (*colmetricpb.ExportMetricsServiceResponse, error)

	// largest is the size of the largest request encoded: a request's
	// buffer is allocated at that size once. A buffer is never reused: the
	// transport may still read a request's body after the call returned
	// (net/http closes it in its own time; gRPC after a cancel). It never
	// shrinks: after one large sweep, a last part of a few points is still
	// allocated that large (review finding 8, left: about 2 MB a part at
	// 1000 points, garbage at once).
	largest atomic.Int64

	shutdown atomic.Bool
}

var _ metricsExporter = (*wireExporter)(nil)

// errShutdown is Export's error after Shutdown, as the SDK's exporter's.
var errShutdown = errors.New("otlp: metrics exporter is shut down")

func (e *wireExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	if e.shutdown.Load() {
		return errShutdown
	}
	if !wireEncodable(rm) {
		return e.sdk.Export(ctx, rm)
	}
	body := appendMetricsRequest(make([]byte, 0, e.largest.Load()), rm)
	if n := int64(len(body)); n > e.largest.Load() {
		e.largest.Store(n)
	}
	if len(body) > maxRequestBytes {
		return fmt.Errorf("otlp: request body too large: %d bytes, exceeded %d bytes", len(body), maxRequestBytes)
	}
	resp, err := e.send(ctx, body)
	if err != nil {
		return err
	}
	if ps := resp.GetPartialSuccess(); ps != nil && (ps.GetRejectedDataPoints() != 0 || ps.GetErrorMessage() != "") {
		return &PartialSuccess{RejectedItems: ps.GetRejectedDataPoints(), ErrorMessage: ps.GetErrorMessage()}
	}
	return nil
}

func (e *wireExporter) Shutdown(ctx context.Context) error {
	e.shutdown.Store(true)
	return e.sdk.Shutdown(ctx)
}

// PartialSuccess is a collector's partial success of a metrics export sent
// by wireExporter, shaped as the SDK's (partialSuccess reads both).
type PartialSuccess struct {
	RejectedItems int64
	ErrorMessage  string
}

func (p *PartialSuccess) Error() string {
	return fmt.Sprintf("OTLP partial success: %s (%d metric data points rejected)", p.ErrorMessage, p.RejectedItems)
}

// grpcSender sends a request's bytes on conn, headers as metadata joined
// to the context's outgoing metadata, as the SDK's exporter does. One
// difference stays: grpc names the content type from rawCodec's Name,
// application/grpc+proto, where the SDK sends application/grpc; both are
// gRPC's protobuf and every gRPC server takes either (review finding 6).
func grpcSender(conn *grpc.ClientConn, headers map[string]string) func(context.Context, []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
	md := metadata.New(headers)
	return func(ctx context.Context, body []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
		if len(md) > 0 {
			out := md
			if old, ok := metadata.FromOutgoingContext(ctx); ok {
				out = metadata.Join(md, old)
			}
			ctx = metadata.NewOutgoingContext(ctx, out)
		}
		var resp colmetricpb.ExportMetricsServiceResponse
		if err := conn.Invoke(ctx, metricsExportMethod, rawRequest(body), &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
			return nil, err
		}
		return &resp, nil
	}
}

// rawRequest is a request already encoded.
type rawRequest []byte

// rawCodec sends a rawRequest as it is and decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

func (rawCodec) Name() string { return "proto" }

// httpSender posts a request's bytes to url as the SDK's OTLP/HTTP
// exporter does: its User-Agent (headers may override it), the headers,
// application/x-protobuf, gzipped when gzipBody (envGzip). A 2xx answer is
// a success; its body is decoded only when it is application/x-protobuf
// (a partial success), as the SDK decodes it: a gateway's 200 in JSON or
// text is a success too. Another status is an error carrying the quoted
// head of the collector's body (its reason for a 400 or 413).
func httpSender(client *http.Client, url string, headers map[string]string, gzipBody bool) func(context.Context, []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
	return func(ctx context.Context, body []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
		if gzipBody {
			var err error
			if body, err = gzipped(body); err != nil {
				return nil, fmt.Errorf("otlp: %s: gzip: %w", url, err)
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("User-Agent", httpUserAgent)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		if gzipBody {
			req.Header.Set("Content-Encoding", "gzip")
			req.ContentLength = -1 // as the SDK's: chunked
		}
		res, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		b, readErr := readResponse(res.Body, maxResponseBytes)
		if res.StatusCode < 200 || res.StatusCode > 299 {
			return nil, fmt.Errorf("otlp: %s: failed to send metrics: %s (body: %s)", url, res.Status, foreign.Quote(strings.TrimSpace(string(b))))
		}
		if readErr != nil {
			return nil, fmt.Errorf("otlp: %s: read response: %w", url, readErr)
		}
		var resp colmetricpb.ExportMetricsServiceResponse
		if len(b) == 0 || res.Header.Get("Content-Type") != "application/x-protobuf" {
			return &resp, nil
		}
		if err := proto.Unmarshal(b, &resp); err != nil {
			return nil, fmt.Errorf("otlp: %s: response: %w", url, err)
		}
		return &resp, nil
	}
}

// readResponse reads r whole, an error past max bytes (what was read is
// returned with it).
func readResponse(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err == nil && int64(len(b)) > max {
		return b[:max], fmt.Errorf("response body too large: exceeded %d bytes", max)
	}
	return b, err
}

// envGzip reports whether the environment asks OTLP exporters to gzip
// metrics (OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, else
// OTEL_EXPORTER_OTLP_COMPRESSION, "gzip"), as the SDK's OTLP/HTTP
// exporter read it: its other settings are the pipeline's options. Over
// gRPC the SDK ignored it (the pipeline gives it its own connection).
func envGzip(getenv func(string) string) bool {
	v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"))
	if v == "" {
		v = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_COMPRESSION"))
	}
	return v == "gzip"
}

var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(io.Discard) }}

func gzipped(body []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

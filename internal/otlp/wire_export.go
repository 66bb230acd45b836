package otlp

// This file sends the metrics encoded by wire.go, over the pipeline's gRPC
// connection or its HTTP client, as the SDK's exporters would (same
// method or path, headers and content type; retries off); a collection
// wire.go does not encode goes to the SDK's exporter unchanged.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// metricsExportMethod is OTLP's gRPC method for metrics.
const metricsExportMethod = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

// maxResponseBytes bounds an OTLP/HTTP response body read.
const maxResponseBytes = 64 << 10

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
	// (net/http closes it in its own time; gRPC after a cancel).
	largest atomic.Int64
}

var _ metricsExporter = (*wireExporter)(nil)

func (e *wireExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	if !wireEncodable(rm) {
		return e.sdk.Export(ctx, rm)
	}
	body := appendMetricsRequest(make([]byte, 0, e.largest.Load()), rm)
	if n := int64(len(body)); n > e.largest.Load() {
		e.largest.Store(n)
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

func (e *wireExporter) Shutdown(ctx context.Context) error { return e.sdk.Shutdown(ctx) }

// PartialSuccess is a collector's partial success of a metrics export sent
// by wireExporter, shaped as the SDK's (partialSuccess reads both).
type PartialSuccess struct {
	RejectedItems int64
	ErrorMessage  string
}

func (p *PartialSuccess) Error() string {
	return fmt.Sprintf("OTLP partial success: %s (%d metric data points rejected)", p.ErrorMessage, p.RejectedItems)
}

// grpcSender sends a request's bytes on conn, headers as metadata.
func grpcSender(conn *grpc.ClientConn, headers map[string]string) func(context.Context, []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
	md := metadata.New(headers)
	return func(ctx context.Context, body []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
		if len(md) > 0 {
			ctx = metadata.NewOutgoingContext(ctx, md)
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

// httpSender posts a request's bytes to url as OTLP/HTTP protobuf.
func httpSender(client *http.Client, url string, headers map[string]string) func(context.Context, []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
	return func(ctx context.Context, body []byte) (*colmetricpb.ExportMetricsServiceResponse, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		res, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes))
		if err != nil {
			return nil, fmt.Errorf("otlp: %s: read response: %w", url, err)
		}
		if res.StatusCode < 200 || res.StatusCode > 299 {
			return nil, fmt.Errorf("otlp: %s: failed to send metrics: %s", url, res.Status)
		}
		var resp colmetricpb.ExportMetricsServiceResponse
		if err := proto.Unmarshal(b, &resp); err != nil {
			return nil, fmt.Errorf("otlp: %s: response: %w", url, err)
		}
		return &resp, nil
	}
}

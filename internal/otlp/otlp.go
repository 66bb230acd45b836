// Package otlp pushes the node agent's metrics and usage events to an
// OpenTelemetry Collector over OTLP (gRPC or HTTP/protobuf), and never in a
// sweep's way: a sweep only wakes the metrics export and queues events;
// the exports run on their own goroutines, each bounded by a timeout, the
// event queue by a count and a byte size, and whatever is dropped is
// counted.
//
// Metrics are cumulative: an export that fails is superseded by the next,
// which carries every counter whole, so an outage loses resolution, never
// totals. Events are kept and sent again while the collector cannot be
// reached (connection refused, Unavailable), up to the queue's bounds; a
// batch the collector may have taken (a timeout, a connection cut after the
// request was written) is sent again too, and counted resent: every event
// carries log.record.uid, by which a consumer deduplicates. A partial
// success is an export the collector took: only the items it says it
// rejected are counted so. Config.Settled hears of every event that left
// the queue for good.
package otlp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Protocols.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Defaults of Config's bounds.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultQueueRecords = 8192
	DefaultQueueBytes   = 16 << 20
	// maxBatch is the most event records in one export (at most about 5
	// KiB each: every string attribute is cut to 253 bytes), under a
	// collector's default 4 MiB request.
	maxBatch = 512
	// maxPointsPerExport is the most metric data points in one export: at
	// most about 2 KiB each (seven attributes of 253 bytes), under a
	// collector's default 4 MiB request.
	maxPointsPerExport = 1000
	// maxBackoff is the longest wait before an event batch is sent again
	// to a collector that could not be reached.
	maxBackoff = 5 * time.Second
)

// Config configures a Pipeline.
type Config struct {
	// Endpoint is the collector: http://HOST:PORT (plaintext),
	// https://HOST:PORT (TLS) or unix:///PATH (plaintext over a Unix
	// socket).
	Endpoint string
	// Protocol is ProtocolGRPC (default) or ProtocolHTTP.
	Protocol string
	// CAFile verifies an https endpoint's certificate (default: the
	// system's roots); CertFile and KeyFile are a client certificate.
	CAFile, CertFile, KeyFile string
	// Headers are sent with every export (e.g. an authorization header).
	Headers map[string]string
	// Timeout bounds each export (DefaultTimeout where zero).
	Timeout time.Duration
	// QueueRecords and QueueBytes bound the events waiting to be sent
	// (defaults where zero). Initial and periodic events may fill three
	// quarters of either; finals all of it.
	QueueRecords, QueueBytes int
	// Resource describes this agent (service.name and the like).
	Resource []attribute.KeyValue
	// CardinalityLimit bounds each instrument's attribute sets (past it the
	// SDK folds them into one overflow point); 0: no limit. Producer, when
	// set, adds its metrics to every export (nodeagent.Distributions).
	CardinalityLimit int
	Producer         sdkmetric.Producer
	// Settled, when set, is called with the log.record.uid attribute values
	// of the usage events that left the queue for good (records without
	// one are left out): sent (the collector took them), rejected (the
	// collector refused them, the rejected share of a partial success, a
	// record too large to send alone) and dropped queue-full at emit. It
	// is not called for the events still queued, nor for those dropped at
	// shutdown (still queued when Run returned, or emitted after: the
	// agent keeps them to send after its restart). It is called without
	// the queue's lock held, possibly at once from several goroutines (it
	// must be safe for concurrent use): from Run's export goroutine, from
	// Flush's caller, and for a queue-full drop from the emitting
	// goroutine, inside Logger.Emit (so a Settled that takes a lock the
	// emitter holds around Emit deadlocks). It should be quick: it holds
	// up the exports. The slice is the callee's.
	Settled func(uids []string)
}

// Pipeline is an OTLP export: its providers are what nodeagent.OTel
// takes. Run exports until its context ends.
type Pipeline struct {
	cfg    Config
	logger *slog.Logger

	meters  *sdkmetric.MeterProvider
	reader  *sdkmetric.ManualReader
	loggers *sdklog.LoggerProvider
	queue   *eventQueue

	metricExp metricsExporter
	logExp    sdklog.Exporter
	conn      *grpc.ClientConn // nil over HTTP

	wake chan struct{} // a sweep finished: export the metrics

	exports *prometheus.CounterVec // signal, result
}

// New returns a Pipeline to cfg's endpoint. Nothing is dialled before the
// first export.
func New(cfg Config, logger *slog.Logger) (*Pipeline, error) {
	cfg.Protocol = cmp.Or(cfg.Protocol, ProtocolGRPC)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.QueueRecords = cmp.Or(cfg.QueueRecords, DefaultQueueRecords)
	cfg.QueueBytes = cmp.Or(cfg.QueueBytes, DefaultQueueBytes)
	if cfg.Timeout < 0 || cfg.QueueRecords < 0 || cfg.QueueBytes < 0 {
		return nil, errors.New("otlp: negative timeout or queue bound")
	}
	ep, err := ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	tlsConf, err := tlsConfig(ep, cfg)
	if err != nil {
		return nil, err
	}
	p := &Pipeline{cfg: cfg, logger: logger, wake: make(chan struct{}, 1)}
	ctx := context.Background()
	switch cfg.Protocol {
	case ProtocolGRPC:
		creds := insecure.NewCredentials()
		if tlsConf != nil {
			creds = credentials.NewTLS(tlsConf)
		}
		// Reconnect soon after a collector restart (gRPC's default backoff
		// grows to two minutes): at most maxBackoff, as events are retried.
		// noteHandler tells an export cut after its request was written
		// from one never sent (classify).
		p.conn, err = grpc.NewClient(ep.grpcTarget(), grpc.WithTransportCredentials(creds), grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: min(cfg.Timeout/2, 5*time.Second),
		}), grpc.WithStatsHandler(noteHandler{}))
		if err != nil {
			return nil, fmt.Errorf("otlp: endpoint %q: %w", cfg.Endpoint, err)
		}
		var sdkExp sdkmetric.Exporter
		sdkExp, err = otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithGRPCConn(p.conn), otlpmetricgrpc.WithHeaders(cfg.Headers),
			otlpmetricgrpc.WithTimeout(cfg.Timeout), otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}))
		p.metricExp = &wireExporter{sdk: sdkExp, send: grpcSender(p.conn, cfg.Headers)}
		if err == nil {
			p.logExp, err = otlploggrpc.New(ctx, otlploggrpc.WithGRPCConn(p.conn), otlploggrpc.WithHeaders(cfg.Headers),
				otlploggrpc.WithTimeout(cfg.Timeout), otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: false}))
		}
	case ProtocolHTTP:
		client := ep.httpClient(tlsConf, cfg.Timeout)
		var sdkExp sdkmetric.Exporter
		sdkExp, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(ep.httpURL("/v1/metrics")), otlpmetrichttp.WithHTTPClient(client),
			otlpmetrichttp.WithHeaders(cfg.Headers), otlpmetrichttp.WithTimeout(cfg.Timeout), otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: false}))
		p.metricExp = &wireExporter{sdk: sdkExp, send: httpSender(client, ep.httpURL("/v1/metrics"), cfg.Headers, envGzip(os.Getenv))}
		if err == nil {
			p.logExp, err = otlploghttp.New(ctx, otlploghttp.WithEndpointURL(ep.httpURL("/v1/logs")), otlploghttp.WithHTTPClient(client),
				otlploghttp.WithHeaders(cfg.Headers), otlploghttp.WithTimeout(cfg.Timeout), otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}))
		}
	default:
		return nil, fmt.Errorf("otlp: protocol %q: want %s or %s", cfg.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	if err != nil {
		p.closeConn()
		return nil, fmt.Errorf("otlp: exporter: %w", err)
	}
	res, err := resource.Merge(resource.Empty(), resource.NewSchemaless(cfg.Resource...))
	if err != nil {
		p.closeConn()
		return nil, fmt.Errorf("otlp: resource: %w", err)
	}
	var readerOpts []sdkmetric.ManualReaderOption
	if cfg.Producer != nil {
		readerOpts = append(readerOpts, sdkmetric.WithProducer(cfg.Producer))
	}
	p.reader = sdkmetric.NewManualReader(readerOpts...)
	// The agent's limit (the larger of nodeagent.OTelCardinalityLimit, its
	// template cap and 1000 workloads' series with --label-actor, and
	// nodeagent.OTelContainerCardinalityLimit, max-containers+1 container
	// series of each; never folded), so that no tenant's template or
	// container names outgrow it here either.
	p.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader), sdkmetric.WithResource(res), sdkmetric.WithCardinalityLimit(cfg.CardinalityLimit))
	p.queue = newEventQueue(cfg.QueueRecords, cfg.QueueBytes, logger, cfg.Settled)
	p.loggers = sdklog.NewLoggerProvider(sdklog.WithProcessor(p.queue), sdklog.WithResource(res))
	p.exports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxstats_agent_otlp_exports_total",
		Help: "OTLP exports by signal (metrics, logs) and result: ok; partial (the collector took the export but rejected some of its items: logs: counted in " + metricEventsDropped + "); failed (metrics: superseded by the next export, which carries every counter whole; logs: see " + metricEventsDropped + "); retry (logs: the collector could not be reached, or the export's outcome is unknown: counted in " + metricEventsResent + "; the batch is kept and sent again).",
	}, []string{"signal", "result"})
	return p, nil
}

// Collectors are the pipeline's own Prometheus metrics: its exports and
// its event queue.
func (p *Pipeline) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{p.exports}, p.queue.collectors()...)
}

// Meters are the metrics' provider (nodeagent.OTel.Meters).
func (p *Pipeline) Meters() metric.MeterProvider { return p.meters }

// Loggers are the usage events' provider (nodeagent.OTel.Loggers).
func (p *Pipeline) Loggers() otellog.LoggerProvider { return p.loggers }

// Swept wakes the metrics export (nodeagent.OTel.Swept): it never blocks;
// a sweep that finishes while an export runs is exported next, once.
func (p *Pipeline) Swept() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run exports until ctx ends, then sends what is queued once more within
// Timeout and shuts the exporters down.
func (p *Pipeline) Run(ctx context.Context) error {
	defer p.closeConn()
	var wg sync.WaitGroup
	wg.Go(func() { p.exportMetricsLoop(ctx) })
	wg.Go(func() { p.exportEventsLoop(ctx) })
	wg.Wait()
	// Events first (a final is one activation's whole account), then the
	// metrics, each within its own Timeout; whatever is left, or emitted
	// from now on, is counted dropped.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
	p.queue.drainOnce(ectx, p.sendEvents)
	cancel()
	p.queue.close()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
	defer cancel()
	p.exportMetrics(mctx)
	return errors.Join(p.metricExp.Shutdown(mctx), p.logExp.Shutdown(mctx), p.meters.Shutdown(mctx), p.loggers.Shutdown(mctx))
}

// Flush exports the metrics and sends the queued events now, on the
// caller's goroutine, within Timeout each (a benchmark's or a test's
// export, without Run).
func (p *Pipeline) Flush(ctx context.Context) {
	p.exportMetrics(ctx)
	p.queue.drainOnce(ctx, p.sendEvents)
}

func (p *Pipeline) closeConn() {
	if p.conn != nil {
		p.conn.Close()
	}
}

func (p *Pipeline) exportMetricsLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.exportMetrics(ctx)
	}
}

// exportMetrics collects the latest sweep and sends it once, in parts of
// at most maxPointsPerExport points, each within Timeout; the first that
// fails is counted and ends the export (the next one carries every
// cumulative counter whole). A partial success is a part the collector
// took: the export goes on.
func (p *Pipeline) exportMetrics(ctx context.Context) {
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(ctx, &rm); err != nil {
		p.logger.Warn("otlp: collect metrics", "err", err)
		return
	}
	for _, chunk := range splitMetrics(&rm, maxPointsPerExport) {
		ectx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		err := p.metricExp.Export(ectx, chunk)
		cancel()
		if n, ok := partialSuccess(err); ok {
			result := "ok"
			if n > 0 {
				result = "partial"
				p.queue.warn("metrics-partial", fmt.Sprintf("otlp: the collector rejected %d metric data points of an export", n), err)
			}
			p.exports.WithLabelValues("metrics", result).Inc()
			continue
		}
		if err != nil {
			// The rest waits for the next export, which carries every
			// counter whole: a hung collector costs one Timeout, not one
			// a part.
			p.exports.WithLabelValues("metrics", "failed").Inc()
			p.queue.warn("metrics", "otlp: metrics export failed (the next export carries every counter whole)", err)
			return
		}
		p.exports.WithLabelValues("metrics", "ok").Inc()
	}
}

// exportEventsLoop sends queued events as they come, and after a failure
// to reach the collector or an export of unknown outcome, again after a
// backoff.
func (p *Pipeline) exportEventsLoop(ctx context.Context) {
	backoff := time.Duration(0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		if backoff > 0 {
			timer.Reset(backoff)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-p.queue.wake:
			}
		}
		if p.queue.drainOnce(ctx, p.sendEvents) {
			backoff = min(max(2*backoff, 250*time.Millisecond), maxBackoff)
		} else {
			backoff = 0
		}
	}
}

// sendEvents exports batch within Timeout (a send in flight is not cut
// short by the agent's shutdown: it has its own bound) and says what
// became of it.
func (p *Pipeline) sendEvents(ctx context.Context, batch []sdklog.Record) outcome {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
	defer cancel()
	ectx, note := withSendNote(ectx)
	err := p.logExp.Export(ectx, batch)
	out := p.classify(err, note)
	switch out.res {
	case sent:
		if out.rejected > 0 {
			p.exports.WithLabelValues("logs", "partial").Inc()
			p.queue.warn("partial", fmt.Sprintf("otlp: the collector took an event batch but rejected %d of its %d events (counted in %s)", out.rejected, len(batch), metricEventsDropped), err)
			break
		}
		p.exports.WithLabelValues("logs", "ok").Inc()
	case keep:
		p.exports.WithLabelValues("logs", "retry").Inc()
		p.queue.warn("unreached", "otlp: collector not reached; events kept and sent again", err)
	case tooLarge:
		p.exports.WithLabelValues("logs", "retry").Inc()
		p.queue.warn("too-large", "otlp: the collector refused an event batch as too large; sending smaller ones", err)
	case uncertain:
		p.exports.WithLabelValues("logs", "retry").Inc()
		p.queue.warn("uncertain", "otlp: events export timed out or its connection was cut after the request was written; the collector may have taken them: sent again (counted in "+metricEventsResent+"), a consumer deduplicates by log.record.uid", err)
	default:
		p.exports.WithLabelValues("logs", "failed").Inc()
		p.queue.warn("rejected", "otlp: events refused by the collector", err)
	}
	return out
}

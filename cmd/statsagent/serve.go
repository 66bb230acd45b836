package main

// This file is the metrics server: /metrics and /healthz over HTTP, bounded
// in connections, requests in flight, header bytes and time, so that a
// neighbour that reaches the port (any pod, in a DaemonSet without the
// NetworkPolicy) cannot grow the agent to its memory limit.

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/connlimit"
)

// The metrics server's bounds. Before them (only ReadHeaderTimeout),
// 15,000 keep-alive connections took the agent from 15 to 300 MiB and
// stayed open, and 300 connections each sending 1 MB of headers, never
// ended, took it to 345 MiB.
const (
	// readHeaderTimeout bounds a request's headers, readTimeout the whole
	// request (a scrape has no body).
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	// writeTimeout bounds a response: a scrape of the largest snapshot
	// (1000 workloads with actor labels) is written in well under a second.
	writeTimeout = 30 * time.Second
	// maxHeaderBytes bounds a request's headers (net/http allows 4 KiB
	// more); a scraper sends well under 1 KiB, a bearer token included.
	maxHeaderBytes = 16 << 10
	// idleTimeout bounds a connection between requests. Keep-alives are
	// off (a connection ends with its answer), so no connection idles
	// today; it holds the bound should a scraper's connection be kept.
	idleTimeout = 5 * time.Second
)

const (
	metricHTTPConnsOpen       = "sandboxstats_agent_http_connections_open"
	metricHTTPConnsRefused    = "sandboxstats_agent_http_connections_refused_total"
	metricHTTPRequestsRefused = "sandboxstats_agent_http_requests_refused_total"
)

// metricsServer serves h on a listener: at most maxConns connections open
// (more are closed at accept), at most maxInFlight scrapes of /metrics at
// once (more are answered 503 at once), keep-alives off (a scraper connects
// once a scrape: no connection idles in a slot).
type metricsServer struct {
	srv      *http.Server
	ln       *connlimit.Listener
	inFlight chan struct{}
	refused  prometheus.Counter
}

func newMetricsServer(ln net.Listener, h http.Handler, maxConns, maxInFlight int, logger *slog.Logger) *metricsServer {
	s := &metricsServer{
		ln:       connlimit.NewListener(ln, maxConns, logger, "metrics connection refused: --metrics-max-connections are open"),
		inFlight: make(chan struct{}, maxInFlight),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: metricHTTPRequestsRefused,
			Help: "Scrapes of /metrics answered 503 at once: --metrics-max-requests were in flight."}),
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.limit(h))
	mux.Handle("/", h)
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	s.srv.SetKeepAlivesEnabled(false)
	return s
}

// limit serves h to at most cap(s.inFlight) requests at once and answers
// the others 503 without doing h's work.
func (s *metricsServer) limit(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.inFlight <- struct{}{}:
			defer func() { <-s.inFlight }()
			h.ServeHTTP(w, r)
		default:
			s.refused.Inc()
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many scrapes in flight", http.StatusServiceUnavailable)
		}
	})
}

// Collectors are the server's own metrics, to gather at every scrape.
func (s *metricsServer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricHTTPConnsOpen,
			Help: "Connections to the metrics port open now (at most --metrics-max-connections)."},
			func() float64 { return float64(s.ln.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricHTTPConnsRefused,
			Help: "Connections to the metrics port closed at accept: --metrics-max-connections were open."},
			func() float64 { return float64(s.ln.Refused()) }),
		s.refused,
	}
}

// Serve serves until Shutdown or Close (http.Server.Serve).
func (s *metricsServer) Serve() error { return s.srv.Serve(s.ln) }

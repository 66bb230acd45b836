package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsUncompressed: /metrics answers plain text to a scraper that
// asks for gzip (as Prometheus and Go's client do): the bridge's few lines
// are not worth a compressor.
func TestMetricsUncompressed(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "sandboxstats_nri_test_total", Help: "A test counter."}))
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	rec := httptest.NewRecorder()
	handler(nil, reg).ServeHTTP(rec, req)
	if enc := rec.Header().Get("Content-Encoding"); enc != "" {
		t.Errorf("Content-Encoding %q, want none", enc)
	}
	if body := rec.Body.String(); !strings.Contains(body, "sandboxstats_nri_test_total 0\n") {
		t.Errorf("body %q lacks the counter", body)
	}
}

package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serveTest serves h through a metricsServer on loopback and returns its
// base URL.
func serveTest(t *testing.T, h http.Handler, maxConns, maxInFlight int) (*metricsServer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newMetricsServer(ln, h, maxConns, maxInFlight, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { s.srv.Close() })
	return s, "http://" + ln.Addr().String()
}

// TestMetricsServerInFlight: with two scrapes in flight (held by a slow
// handler) a third is answered 503 at once, without the handler's work,
// and counted; /healthz is not limited; once the two finish, a scrape is
// served again.
func TestMetricsServerInFlight(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	entered := 0
	arrived := make(chan struct{}, 8)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			mu.Lock()
			entered++
			mu.Unlock()
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok\n")
	})
	s, base := serveTest(t, h, 8, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if resp, err := http.Get(base + "/metrics"); err == nil {
				resp.Body.Close()
			}
		})
	}
	<-arrived
	<-arrived
	start := time.Now()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || time.Since(start) > time.Second {
		t.Errorf("a third scrape: %s after %v, want 503 at once", resp.Status, time.Since(start))
	}
	if resp, err := http.Get(base + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz while scrapes are in flight: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	close(release)
	wg.Wait()
	if resp, err := http.Get(base + "/metrics"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a scrape after: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if entered != 3 || testutil.ToFloat64(s.refused) != 1 {
		t.Errorf("handler entered %d times, %v refused; want 3 and 1", entered, testutil.ToFloat64(s.refused))
	}
}

// TestMetricsServerBounds: headers past maxHeaderBytes are refused (431),
// a connection over the cap is closed at accept and counted, and an
// answered connection is closed (no keep-alive holds a slot).
func TestMetricsServerBounds(t *testing.T) {
	s, base := serveTest(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }), 2, 2)
	addr := strings.TrimPrefix(base, "http://")

	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("X-Pad", strings.Repeat("a", maxHeaderBytes+8<<10))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: %v %v, want 431", maxHeaderBytes+8<<10, resp, err)
	} else {
		resp.Body.Close()
	}

	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !resp.Close {
		t.Error("the answer keeps the connection alive")
	}

	waitOpen := func(n int) {
		for deadline := time.Now().Add(5 * time.Second); s.ln.Open() != n && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOpen(0) // the server closes the answered connections
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitOpen(2)
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a connection over the cap read %d bytes, %v; want EOF", n, err)
	}
	got := map[string]float64{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue() + f.GetMetric()[0].GetCounter().GetValue()
	}
	want := map[string]float64{metricHTTPConnsOpen: 2, metricHTTPConnsRefused: 1, metricHTTPRequestsRefused: 0}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], v, got)
		}
	}
}

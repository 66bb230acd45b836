package otlp

import (
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestHTTPProtobuf: the HTTP/protobuf transport delivers metrics and events
// to /v1/metrics and /v1/logs, and a 503 keeps the events for later.
func TestHTTPProtobuf(t *testing.T) {
	var mu sync.Mutex
	paths := map[string]int{}
	unavailable := true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		if unavailable && r.URL.Path == "/v1/logs" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		paths[r.URL.Path]++
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p, _, emit := startPipeline(t, Config{Endpoint: "http://" + ln.Addr().String(), Protocol: ProtocolHTTP, Timeout: time.Second})
	emit("a", "final")
	p.Swept()
	waitFor(t, "a kept batch after a 503", func() bool { return testutil.ToFloat64(p.exports.WithLabelValues("logs", "retry")) >= 1 })
	mu.Lock()
	unavailable = false
	mu.Unlock()
	waitFor(t, "the event and the metrics delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return paths["/v1/logs"] == 1 && paths["/v1/metrics"] >= 1
	})
}

// TestHTTPTimeoutResent: over HTTP/protobuf, a batch whose export timed
// out after the collector read it may have been taken: it is sent again
// after the backoff, counted resent, and settled once, when taken.
func TestHTTPTimeoutResent(t *testing.T) {
	var mu sync.Mutex
	posts := 0
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/v1/logs" {
			return
		}
		mu.Lock()
		posts++
		first := posts == 1
		mu.Unlock()
		if first {
			<-release // answers only after the exporter gave up
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	var settled settledLog
	p, _, emit := startPipeline(t, Config{Endpoint: srv.URL, Protocol: ProtocolHTTP, Timeout: 300 * time.Millisecond, Settled: settled.add})
	emit("a", "final")
	waitFor(t, "the timed-out batch sent again", func() bool {
		return testutil.ToFloat64(p.queue.sentC.WithLabelValues("final")) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if posts != 2 {
		t.Errorf("the batch was posted %d times, want 2", posts)
	}
	if got := testutil.ToFloat64(p.queue.resent.WithLabelValues("final")); got != 1 {
		t.Errorf("finals resent: %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.exports.WithLabelValues("logs", "retry")); got != 1 {
		t.Errorf("logs exports counted retry: %v, want 1", got)
	}
	if diff := cmp.Diff([]string{"a"}, settled.got()); diff != "" {
		t.Errorf("settled (-want +got):\n%s", diff)
	}
}

// TestTLS: an https endpoint is verified with --otlp-ca-file (and refused
// without it: the system's roots do not know a test certificate); TLS
// files with a plaintext endpoint are refused.
func TestTLS(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got[r.URL.Path]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.URL
	p, _, emit := startPipeline(t, Config{Endpoint: endpoint, Protocol: ProtocolHTTP, CAFile: ca, Timeout: time.Second})
	emit("a", "final")
	p.Swept()
	waitFor(t, "events and metrics over TLS", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["/v1/logs"] == 1 && got["/v1/metrics"] >= 1
	})

	unverified, _, emit2 := startPipeline(t, Config{Endpoint: endpoint, Protocol: ProtocolHTTP, Timeout: time.Second})
	emit2("b", "final")
	waitFor(t, "the unverified server's export refused", func() bool {
		return testutil.ToFloat64(unverified.exports.WithLabelValues("logs", "failed")) >= 1
	})
	mu.Lock()
	defer mu.Unlock()
	if got["/v1/logs"] != 1 {
		t.Errorf("a server the CA does not verify got events: %v", got)
	}
	if _, err := New(Config{Endpoint: "http://127.0.0.1:4318", CAFile: ca}, discard()); err == nil {
		t.Error("a CA file with a plaintext endpoint was accepted")
	}
}

package nodeagent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestHealthzDiscoveryFails: while the socket directory cannot be read (at
// the descriptor limit), /healthz answers 503 and says why, and a sweep is
// not counted; once it can, 200 again.
func TestHealthzDiscoveryFails(t *testing.T) {
	dir := t.TempDir()
	statsdfake.Start(t, filepath.Join(dir, "a.sock")).Set(&sandboxstatsv1.WorkloadStatsSample{ActorUid: "a"})
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: time.Second, Concurrency: 1, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	a.SweepOnce(context.Background())
	if code, body := health(); code != http.StatusOK {
		t.Fatalf("/healthz after a sweep: %d %q", code, body)
	}
	release := testenv.ExhaustDescriptors(t)
	a.SweepOnce(context.Background())
	release()
	code, body := health()
	t.Logf("/healthz while discovery fails: %d %q", code, body)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "too many open files") {
		t.Errorf("/healthz while discovery fails: %d %q, want 503 and the reason", code, body)
	}
	a.SweepOnce(context.Background())
	if code, body := health(); code != http.StatusOK {
		t.Errorf("/healthz once discovery works again: %d %q", code, body)
	}
}

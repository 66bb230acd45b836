package otlp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
)

// settledLog is a Config.Settled that keeps what it is told.
type settledLog struct {
	mu    sync.Mutex
	uids  []string
	calls int
	// check, if set, runs inside each call (e.g. one that takes the
	// queue's lock: a call with it held deadlocks).
	check func()
}

func (s *settledLog) add(uids []string) {
	if s.check != nil {
		s.check()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uids = append(s.uids, uids...)
	s.calls++
}

// got is every uid settled so far, sorted.
func (s *settledLog) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.uids))
}

// uids are newFlushed's emits' log.record.uids uid-a<from>..uid-a<to-1>,
// sorted.
func uids(from, to int) []string {
	var out []string
	for i := range to - from {
		out = append(out, fmt.Sprint("uid-a", from+i))
	}
	slices.Sort(out)
	return out
}

// TestSettled: Config.Settled hears of the events that left the queue for
// good (sent, rejected, dropped queue-full), with their log.record.uid,
// never of those still queued or dropped at shutdown, never with the
// queue's lock held, and leaves out a record without a uid.
func TestSettled(t *testing.T) {
	refusing := func(t *testing.T) string { // HTTP 400: refused for good
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusBadRequest)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	unreached := func(t *testing.T) string { return "unix://" + filepath.Join(t.TempDir(), "nobody.sock") }
	for _, tc := range []struct {
		name     string
		endpoint func(t *testing.T) string
		protocol string
		queue    int // QueueRecords
		emit     int
		shutdown bool // close the queue (Run's end) after the drain
		want     []string
		reason   string // the dropped counter's reason for the rest, "" for sent
	}{
		{name: "sent", endpoint: (&partialCollector{}).serveGRPC, emit: 5, want: uids(0, 5)},
		{name: "partial success", endpoint: (&partialCollector{rejected: 2}).serveGRPC, emit: 5, want: uids(0, 5)},
		{name: "rejected", endpoint: refusing, protocol: ProtocolHTTP, emit: 5, want: uids(0, 5), reason: "rejected"},
		{name: "queue-full, the rest still queued", endpoint: unreached, queue: 4, emit: 6, want: uids(4, 6), reason: "queue-full"},
		{name: "still queued", endpoint: unreached, emit: 3},
		{name: "dropped at shutdown", endpoint: unreached, emit: 3, shutdown: true, reason: "shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var settled settledLog
			p, emit := newFlushed(t, Config{Endpoint: tc.endpoint(t), Protocol: tc.protocol, Timeout: 2 * time.Second,
				QueueRecords: tc.queue, Settled: settled.add}, 0)
			settled.check = func() { p.queue.size() }
			emit(tc.emit)
			p.queue.drainOnce(context.Background(), p.sendEvents)
			if tc.shutdown {
				p.queue.close()
				emit(1) // after the close: dropped at shutdown too
			}
			if diff := cmp.Diff(tc.want, settled.got()); diff != "" {
				t.Errorf("settled (-want +got):\n%s", diff)
			}
			if tc.reason != "" && tc.reason != "queue-full" {
				if got := testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", tc.reason)); got < float64(tc.emit) {
					t.Errorf("dropped %s: %v, want at least %d", tc.reason, got, tc.emit)
				}
			}
		})
	}
}

// TestSettledNoUID: a record without log.record.uid is left out of
// Settled's uids; a batch of none calls it not at all.
func TestSettledNoUID(t *testing.T) {
	var settled settledLog
	p, emit := newFlushed(t, Config{Endpoint: (&partialCollector{}).serveGRPC(t), Timeout: 2 * time.Second, Settled: settled.add}, 0)
	logger := p.Loggers().Logger("test")
	var r otellog.Record
	r.SetEventName("test.event")
	r.AddAttributes(attribute.String(kindKey, "final"))
	logger.Emit(context.Background(), r)
	p.Flush(context.Background())
	if settled.calls != 0 {
		t.Errorf("Settled called %d times for a batch without uids: %v", settled.calls, settled.got())
	}
	logger.Emit(context.Background(), r)
	emit(2)
	p.Flush(context.Background())
	if diff := cmp.Diff(uids(0, 2), settled.got()); diff != "" {
		t.Errorf("settled (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(p.queue.sentC.WithLabelValues("final")); got != 4 {
		t.Errorf("finals sent: %v, want 4", got)
	}
}

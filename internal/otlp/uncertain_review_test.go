package otlp

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	sdklog "go.opentelemetry.io/otel/sdk/log"
)

// TestUncertainForever: a collector that takes every export but answers
// only after --otlp-timeout (overloaded, its persistent queue on a slow
// disk) makes every export's outcome unknown. The batch at the head is
// then sent again after each backoff, for ever, the same records each
// time (each time perhaps taken: duplicates without end), and no record
// behind it is ever sent: the queue fills and every new event is dropped
// queue-full. Before issue 30 such a batch was dropped (counted
// uncertain). Now each record gets maxUnsureSends exports of unknown
// outcome, then it is given up (dropped uncertain, settled).
func TestUncertainForever(t *testing.T) {
	p, emit := newFlushed(t, Config{Endpoint: "unix:///nonexistent/otlp.sock"}, 0)
	emit(2 * maxBatch)
	seen := map[string]int{}
	send := func(_ context.Context, batch []sdklog.Record) outcome {
		for _, r := range batch {
			_, _, uid := recordBytes(&r)
			seen[uid]++
		}
		return outcome{res: uncertain}
	}
	attempts := 0
	for p.queue.drainOnce(context.Background(), send) {
		if attempts++; attempts > 100 {
			t.Fatal("the queue is still resending after 100 exports of unknown outcome")
		}
	}
	counts := map[int]int{}
	for _, n := range seen {
		counts[n]++
	}
	dropped := testutil.ToFloat64(p.queue.dropped.WithLabelValues("periodic", "uncertain")) + testutil.ToFloat64(p.queue.dropped.WithLabelValues("final", "uncertain")) +
		testutil.ToFloat64(p.queue.dropped.WithLabelValues("initial", "uncertain")) + testutil.ToFloat64(p.queue.dropped.WithLabelValues("", "uncertain"))
	t.Logf("%d exports of unknown outcome: %d distinct records sent, times each: %v; %v dropped uncertain", attempts, len(seen), counts, dropped)
	if len(seen) != 2*maxBatch || len(counts) != 1 || counts[maxUnsureSends] != 2*maxBatch || dropped != 2*maxBatch {
		t.Errorf("want each of the %d records sent %d times, then dropped uncertain", 2*maxBatch, maxUnsureSends)
	}
	if n, _ := p.queue.size(); n != 0 {
		t.Errorf("%d records still queued", n)
	}
}

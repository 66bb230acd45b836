package otlp

import (
	"context"
	"testing"

	sdklog "go.opentelemetry.io/otel/sdk/log"
)

// TestUncertainForever: a collector that takes every export but answers
// only after --otlp-timeout (overloaded, its persistent queue on a slow
// disk) makes every export's outcome unknown. The batch at the head is
// then sent again after each backoff, for ever, the same records each
// time (each time perhaps taken: duplicates without end), and no record
// behind it is ever sent: the queue fills and every new event is dropped
// queue-full. Before issue 30 such a batch was dropped (counted
// uncertain); now nothing bounds its resends or shrinks it.
func TestUncertainForever(t *testing.T) {
	t.Skip("BUG: a batch whose export's outcome is always unknown is resent without end, never halved, and blocks the queue (see /work/notes/30-review.md)")
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
	const attempts = 20
	for range attempts {
		if !p.queue.drainOnce(context.Background(), send) {
			t.Fatal("drainOnce did not ask to be called again")
		}
	}
	most := 0
	for _, n := range seen {
		most = max(most, n)
	}
	t.Logf("%d attempts: %d distinct records sent, one of them %d times", attempts, len(seen), most)
	if len(seen) <= maxBatch || most >= attempts {
		t.Errorf("after %d exports of unknown outcome: %d of %d records ever sent, one %d times: the head batch holds the queue for ever",
			attempts, len(seen), 2*maxBatch, most)
	}
}

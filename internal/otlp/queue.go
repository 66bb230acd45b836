package otlp

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
)

// Metric names of the event queue.
const (
	metricEventsSent    = "sandboxstats_agent_otlp_events_sent_total"
	metricEventsDropped = "sandboxstats_agent_otlp_events_dropped_total"
	metricEventsResent  = "sandboxstats_agent_otlp_events_resent_total"
	metricQueueRecords  = "sandboxstats_agent_otlp_queue_records"
	metricQueueBytes    = "sandboxstats_agent_otlp_queue_bytes"
)

// kindKey is the event attribute the queue keeps finals by
// (nodeagent's sandboxstats.stats.kind).
const kindKey = "sandboxstats.stats.kind"

// uidKey is the event attribute Config.Settled reports records by
// (semantic conventions' log.record.uid, nodeagent's eventUID).
const uidKey = "log.record.uid"

// recordOverhead is what a record costs beyond its attributes' strings:
// the SDK's Record (timestamps, severity, scope, resource pointer, its
// inline attributes) and the queue's entry; attrOverhead is each
// attribute's KeyValue beyond its strings. Measured: a final of 20
// attributes holds about 2.3 KiB of heap.
const (
	recordOverhead = 1024
	attrOverhead   = 64
)

// warnEvery bounds the queue's warnings: at most one a warnEvery.
const warnEvery = 30 * time.Second

// eventQueue is the LoggerProvider's processor: it keeps each record the
// agent emits until an export took it, within a count and a byte bound.
// Initial and periodic events may fill three quarters of either bound;
// finals (one per activation, its whole account) all of it.
type eventQueue struct {
	maxRecords, maxBytes int
	logger               *slog.Logger
	wake                 chan struct{}
	settled              func(uids []string) // Config.Settled; nil: none

	mu       sync.Mutex
	recs     []queued
	bytes    int
	batch    int  // the most records the next export sends: maxBatch, halved while the collector refuses batches as too large
	closed   bool // the pipeline stopped: emits are counted dropped
	lastWarn map[string]time.Time

	sentC    *prometheus.CounterVec // kind
	dropped  *prometheus.CounterVec // kind, reason
	resent   *prometheus.CounterVec // kind
	recordsG prometheus.GaugeFunc
	bytesG   prometheus.GaugeFunc
}

type queued struct {
	rec   sdklog.Record
	kind  string
	uid   string // its log.record.uid; "" if none
	bytes int
	// unsure: the exports of it that ended with their outcome unknown
	// (uncertain): the collector may hold it already.
	unsure int
}

// maxUnsureSends is how many exports of unknown outcome a record gets
// before it is given up (counted dropped uncertain, and settled: the
// collector may hold it): a collector that takes every export but always
// answers after --otlp-timeout does not hold the queue for ever.
const maxUnsureSends = 5

// newEventQueue returns a queue of at most maxRecords records and maxBytes
// bytes; settled (nil: none) is Config.Settled.
func newEventQueue(maxRecords, maxBytes int, logger *slog.Logger, settled func(uids []string)) *eventQueue {
	q := &eventQueue{maxRecords: maxRecords, maxBytes: maxBytes, logger: logger, wake: make(chan struct{}, 1), batch: maxBatch,
		lastWarn: map[string]time.Time{}, settled: settled}
	q.sentC = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricEventsSent, Help: "Usage events the collector took, by kind (initial, periodic, final).",
	}, []string{"kind"})
	q.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricEventsDropped, Help: "Usage events not sent, by kind and reason: queue-full (the queue's count or byte bound), rejected (the collector refused them, or took their batch rejecting that many: a partial success), uncertain (given up after 5 exports of unknown outcome: the collector may hold them), shutdown (still queued when the agent stopped).",
	}, []string{"kind", "reason"})
	q.resent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricEventsResent, Help: "Usage events sent again because an earlier send's outcome was unknown (a timeout, or the connection cut after the request was written): the collector may have taken them, so it may get them twice; each carries the same log.record.uid, by which a consumer deduplicates.",
	}, []string{"kind"})
	q.recordsG = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metricQueueRecords, Help: "Usage events waiting to be sent.",
	}, func() float64 { n, _ := q.size(); return float64(n) })
	q.bytesG = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metricQueueBytes, Help: "Bytes of the usage events waiting to be sent (their attributes plus a fixed overhead each).",
	}, func() float64 { _, b := q.size(); return float64(b) })
	return q
}

func (q *eventQueue) collectors() []prometheus.Collector {
	return []prometheus.Collector{q.sentC, q.dropped, q.resent, q.recordsG, q.bytesG}
}

func (q *eventQueue) size() (records, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.recs), q.bytes
}

// recordBytes is what r costs the queue, its kind and its log.record.uid
// ("" where it has none).
func recordBytes(r *sdklog.Record) (bytes int, kind, uid string) {
	bytes = recordOverhead + len(r.EventName())
	r.WalkAttributes(func(kv attribute.KeyValue) bool {
		bytes += len(kv.Key) + attrOverhead
		if kv.Value.Type() == attribute.STRING {
			bytes += len(kv.Value.AsString())
		}
		switch kv.Key {
		case kindKey:
			kind = kv.Value.AsString()
		case uidKey:
			uid = kv.Value.AsString()
		}
		return true
	})
	return bytes, kind, uid
}

// settle calls settled with uids, if both are there. Never with q.mu held:
// the callback takes its owner's lock, and its owner may read the queue's
// gauges under it.
func (q *eventQueue) settle(uids []string) {
	if q.settled != nil && len(uids) > 0 {
		q.settled(uids)
	}
}

// OnEmit implements sdklog.Processor: it queues a copy of r, or counts it
// dropped when the queue is full. It never blocks.
func (q *eventQueue) OnEmit(_ context.Context, r *sdklog.Record) error {
	n, kind, uid := recordBytes(r)
	maxRecs, maxBytes := q.maxRecords, q.maxBytes
	if kind != "final" {
		maxRecs, maxBytes = maxRecs*3/4, maxBytes*3/4
	}
	q.mu.Lock()
	closed := q.closed
	full := len(q.recs)+1 > maxRecs || q.bytes+n > maxBytes
	if !full && !closed {
		q.recs = append(q.recs, queued{rec: r.Clone(), kind: kind, uid: uid, bytes: n})
		q.bytes += n
	}
	q.mu.Unlock()
	switch {
	case closed:
		q.dropped.WithLabelValues(kind, "shutdown").Inc()
		return nil
	case full:
		q.dropped.WithLabelValues(kind, "queue-full").Inc()
		q.warn("queue-full", "otlp: event queue full: events dropped (counted in "+metricEventsDropped+")", nil)
		if uid != "" {
			q.settle([]string{uid})
		}
		return nil
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// Enabled implements sdklog.Processor.
func (q *eventQueue) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }

// Shutdown implements sdklog.Processor; Pipeline.Run drains the queue.
func (q *eventQueue) Shutdown(context.Context) error { return nil }

// ForceFlush implements sdklog.Processor; Pipeline.Run drains the queue.
func (q *eventQueue) ForceFlush(context.Context) error { return nil }

// drainOnce sends the queue's records in batches until it is empty, ctx
// ends or a batch is to be sent again after a backoff (then it returns
// true: the batch stays at the head): one that could not reach the
// collector, or one whose outcome is unknown (the collector may have taken
// it: sent again all the same, its records carrying log.record.uid, and
// counted resent when that later send reaches the collector). Of a batch
// the collector took rejecting some (a partial success: it does not say
// which), the last that many are counted rejected. The records that left
// the queue for good (sent, rejected) are reported to settled, after q.mu
// is released.
func (q *eventQueue) drainOnce(ctx context.Context, send func(context.Context, []sdklog.Record) outcome) (again bool) {
	for ctx.Err() == nil {
		q.mu.Lock()
		n := min(len(q.recs), q.batch)
		batch := make([]sdklog.Record, n)
		for i := range n {
			batch[i] = q.recs[i].rec
		}
		q.mu.Unlock()
		if n == 0 {
			return false
		}
		out := send(ctx, batch)
		res := out.res
		if res == keep {
			return true
		}
		q.mu.Lock()
		if res == sent || res == uncertain {
			// This copy reached the collector, or may have: one that an
			// earlier unknown outcome may have delivered already.
			for _, r := range q.recs[:n] {
				if r.unsure > 0 {
					q.resent.WithLabelValues(r.kind).Inc()
				}
			}
		}
		if res == uncertain {
			// Sent again after the backoff, up to maxUnsureSends times;
			// then given up.
			var uids []string
			keep := q.recs[:0:0]
			for i, r := range q.recs {
				if i < n {
					r.unsure++
					if r.unsure >= maxUnsureSends {
						q.bytes -= r.bytes
						q.dropped.WithLabelValues(r.kind, "uncertain").Inc()
						if r.uid != "" {
							uids = append(uids, r.uid)
						}
						continue
					}
				}
				keep = append(keep, r)
			}
			q.recs = keep
			q.mu.Unlock()
			q.settle(uids)
			return true
		}
		if res == tooLarge {
			if n > 1 { // again at once, in halves
				q.batch = max(n/2, 1)
				q.mu.Unlock()
				continue
			}
			res = rejected // one record too large: it never fits
		}
		taken := q.recs[:n]
		firstRejected := n - int(min(out.rejected, int64(n)))
		var uids []string
		for i, r := range taken {
			q.bytes -= r.bytes
			switch {
			case res == sent && i >= firstRejected, res == rejected:
				q.dropped.WithLabelValues(r.kind, "rejected").Inc()
			case res == sent:
				q.sentC.WithLabelValues(r.kind).Inc()
			}
			if r.uid != "" {
				uids = append(uids, r.uid)
			}
		}
		// A new slice, so the records sent are not held by the old array.
		q.recs = append([]queued(nil), q.recs[n:]...)
		if res == sent {
			q.batch = min(2*q.batch, maxBatch) // back toward full batches
		}
		q.mu.Unlock()
		q.settle(uids)
	}
	return false
}

// close counts whatever is still queued, and every record emitted from now
// on, as dropped at shutdown; none is reported to settled (the agent sends
// them again after its restart).
func (q *eventQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range q.recs {
		q.dropped.WithLabelValues(r.kind, "shutdown").Inc()
	}
	q.recs, q.bytes, q.closed = nil, 0, true
}

// warn logs msg at most once a warnEvery per key (a failure every sweep
// of one kind does not hide another's).
func (q *eventQueue) warn(key, msg string, err error) {
	q.mu.Lock()
	now := time.Now()
	if now.Sub(q.lastWarn[key]) < warnEvery {
		q.mu.Unlock()
		return
	}
	q.lastWarn[key] = now
	q.mu.Unlock()
	if err != nil {
		q.logger.Warn(msg, "err", err)
	} else {
		q.logger.Warn(msg)
	}
}

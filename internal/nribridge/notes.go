package nribridge

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// notesQueue bounds the records waiting for the log.
	notesQueue = 256
	// noteEvery is how often one key is logged at most; the records
	// suppressed meanwhile are counted in the next.
	noteEvery = 10 * time.Second
	// maxNoteKeys bounds the keys remembered (they are a few per reason
	// and statsd; over it the oldest are forgotten).
	maxNoteKeys = 1024
)

// notes is the log of what the bridge cannot act on: written by one
// goroutine, so that an event handler never waits for stderr, and rate
// bounded per key (the same reason is logged at most once every 10s, with
// how many were suppressed).
type notes struct {
	log     *slog.Logger
	ch      chan note
	dropped prometheus.Counter
	last    map[string]time.Time
	held    map[string]int
}

type note struct {
	level slog.Level
	msg   string
	key   string
	attrs []any
}

func newNotes(log *slog.Logger, dropped prometheus.Counter) *notes {
	return &notes{log: log, ch: make(chan note, notesQueue), dropped: dropped, last: map[string]time.Time{}, held: map[string]int{}}
}

// add queues a record; a full queue drops it (counted). An empty key is
// never rate bounded.
func (n *notes) add(level slog.Level, msg, key string, attrs ...any) {
	if !n.log.Enabled(context.Background(), level) {
		return
	}
	select {
	case n.ch <- note{level: level, msg: msg, key: key, attrs: attrs}:
	default:
		n.dropped.Inc()
	}
}

func (n *notes) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-n.ch:
			n.write(ctx, r, time.Now())
		}
	}
}

func (n *notes) write(ctx context.Context, r note, now time.Time) {
	if r.key != "" {
		k := r.key
		if t, ok := n.last[k]; ok && now.Sub(t) < noteEvery {
			n.held[k]++
			return
		}
		if len(n.last) >= maxNoteKeys {
			clear(n.last)
			clear(n.held)
		}
		n.last[k] = now
		if s := n.held[k]; s > 0 {
			r.attrs = append(r.attrs, "suppressed", s)
			delete(n.held, k)
		}
	}
	n.log.Log(ctx, r.level, r.msg, r.attrs...)
}

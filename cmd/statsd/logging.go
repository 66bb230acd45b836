package main

// This file is statsd's logging: slog, every record bounded, and the
// logrus logger that containerd/log gives ttrpc quieted.

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// newLogger is statsd's logger: text lines to w, every string of a record
// cut (foreign.Handler), so no line grows with what a peer sent.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(foreign.Handler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
}

var quietOnce sync.Once

// quietContainerdLog routes containerd/log, a global logrus logger that
// ttrpc writes to (one line per frame on an inactive stream: 85 MB in 10 s
// from a hostile agent), into logger: errors only, at most one line per
// second, each cut, with the count of lines dropped since the last. It is
// set once per process; the microvm source cuts such connections itself.
func quietContainerdLog(logger *slog.Logger) {
	quietOnce.Do(func() {
		_ = log.SetLevel("error")
		log.L.Logger.SetOutput(&limitedLog{log: logger.With("component", "ttrpc"), every: time.Second})
	})
}

// limitedLog is an io.Writer of log lines that passes at most one per
// interval.
type limitedLog struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (l *limitedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.last) >= l.every {
		l.log.Warn("containerd/ttrpc: "+foreign.Bound(strings.TrimSpace(string(p[:min(len(p), 4096)])), 512), "dropped_since_last", l.dropped)
		l.last, l.dropped = now, 0
	} else {
		l.dropped++
	}
	return len(p), nil
}

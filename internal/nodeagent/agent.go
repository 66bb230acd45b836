package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// Config is the node agent's configuration (cmd/statsagent's flags).
type Config struct {
	// Sockets is the glob of statsd sockets, such as "/run/statsd/*.sock".
	Sockets string
	// Interval between sweeps; 0 disables sweeping (only the agent's own
	// metrics are served).
	Interval time.Duration
	// Timeout bounds each StatsActiveWorkloads call.
	Timeout time.Duration
	// Concurrency is the most daemons polled at once.
	Concurrency int
	// SweepTimeout bounds a whole sweep; 0 means the larger of Interval and
	// Timeout. Daemons not polled within it are "skipped"
	// (sweep.Config.SweepTimeout).
	SweepTimeout time.Duration
	// AllowUIDs are the uids a socket's owner and its server may have; nil:
	// root and the agent's own uid (sweep.DefaultAllowedUIDs).
	AllowUIDs []uint32
	// Limits bound each daemon's answer (sweep.DefaultLimits where zero).
	Limits sweep.Limits
	// LabelActor, LabelInterface, Grace, EndedHorizon, MaxTemplates and
	// ActivationLog: see metricsConfig.
	LabelActor     bool
	LabelInterface bool
	Grace          time.Duration
	EndedHorizon   time.Duration
	MaxTemplates   int
	ActivationLog  io.Writer
	// OTel, when set, gets the metrics and the usage events over
	// OpenTelemetry (metricsConfig.OTel).
	OTel *OTel
}

// Agent sweeps on a timer and serves the result as Prometheus metrics.
type Agent struct {
	cfg     Config
	logger  *slog.Logger
	reg     *prometheus.Registry // the agent's metrics: they change with a sweep
	live    *prometheus.Registry // the Go and process collectors, promhttp's
	metrics *metrics
	pool    *sweep.Pool // one connection per daemon, kept across sweeps

	started  time.Time
	lastDone atomic.Int64 // unix nanos of the last completed sweep; 0 if none

	answered    map[string]bool // sockets that answered in the last sweep
	lastRefused int
}

// New returns an Agent with its own registry (no global state).
func New(cfg Config, logger *slog.Logger) (*Agent, error) {
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.Grace < 0 || cfg.SweepTimeout < 0 {
		return nil, errors.New("agent: negative interval, timeout, sweep timeout or grace")
	}
	if _, err := sweep.Discover(cfg.Sockets); err != nil {
		return nil, err
	}
	reg, live := prometheus.NewRegistry(), prometheus.NewRegistry()
	live.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	started := time.Now()
	m, err := newMetrics(reg, metricsConfig{LabelActor: cfg.LabelActor, LabelInterface: cfg.LabelInterface, Grace: cfg.Grace,
		Started: started, EndedHorizon: cfg.EndedHorizon, MaxTemplates: cfg.MaxTemplates, ActivationLog: cfg.ActivationLog, OTel: cfg.OTel}, logger)
	if err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	pool := sweep.Config{Concurrency: cfg.Concurrency, Timeout: cfg.Timeout, SweepTimeout: cmp.Or(cfg.SweepTimeout, max(cfg.Interval, cfg.Timeout)),
		Limits: cfg.Limits, AllowUIDs: cfg.AllowUIDs}.NewPool()
	return &Agent{cfg: cfg, logger: logger, reg: reg, live: live, metrics: m, pool: pool, started: started}, nil
}

// RegisterLive adds collectors gathered at every scrape (not once per
// sweep), such as the OTLP pipeline's.
func (a *Agent) RegisterLive(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := a.live.Register(c); err != nil {
			return fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	return nil
}

// Close closes the connections the agent keeps to its daemons (Run does
// when it returns). A later sweep dials them afresh.
func (a *Agent) Close() error { return a.pool.Close() }

// SweepOnce runs one sweep and makes it the exported snapshot. The daemons
// that answered in the previous sweep are polled first, the others in a
// random order: daemons that hang cannot use up the sweep's bound before
// the good ones, nor always the same good ones.
func (a *Agent) SweepOnce(ctx context.Context) []sweep.DaemonResult {
	start := time.Now()
	d, err := sweep.DiscoverAllowed(a.cfg.Sockets, a.cfg.AllowUIDs)
	if err != nil { // the glob was checked in New; keep the old snapshot
		a.logger.Error("sweep", "err", err)
		return nil
	}
	for _, r := range d.Refused {
		a.metrics.refused.WithLabelValues(r.Reason).Inc()
		a.logger.Debug("socket refused", "path", r.Path, "reason", r.Reason)
	}
	if n := len(d.Refused); n != a.lastRefused {
		a.logger.Warn("sockets in the glob refused (symlink, owner not allowed, or a duplicate)", "refused", n)
		a.lastRefused = n
	}
	results := a.pool.PollAll(ctx, a.order(d.Sockets))
	slices.SortFunc(results, func(x, y sweep.DaemonResult) int { return strings.Compare(x.Socket, y.Socket) })
	a.answered = map[string]bool{}
	for _, r := range results {
		if r.Status == sweep.StatusOK || r.Status == sweep.StatusNoSample {
			a.answered[r.Socket] = true
		}
	}
	took := time.Since(start)
	if ctx.Err() != nil {
		return results // shutting down: a cancelled sweep is not a snapshot
	}
	now := time.Now()
	a.metrics.Apply(results, now, took)
	a.lastDone.Store(now.UnixNano())
	if a.cfg.OTel != nil && a.cfg.OTel.Swept != nil {
		a.cfg.OTel.Swept()
	}
	for _, r := range results {
		switch r.Status {
		case sweep.StatusError:
			a.logger.Debug("poll failed", "socket", r.Socket, "code", r.Code.String(), "err", r.Err, "took", r.Took)
		case sweep.StatusVanished:
			a.logger.Debug("daemon vanished", "socket", r.Socket)
		case sweep.StatusSkipped:
			a.logger.Debug("daemon not polled: the sweep's bound ran out", "socket", r.Socket)
		}
		if len(r.Capped) > 0 {
			a.logger.Warn("answer over its cap dropped", "socket", r.Socket, "parts", r.Capped)
		}
		if r.PeerRefused {
			a.logger.Warn("daemon refused: its server's uid is not allowed", "socket", r.Socket, "err", r.Err)
		}
	}
	a.logger.Debug("sweep done", "daemons", len(results), "took", took)
	return results
}

// order returns sockets (sorted) with those that answered in the last
// sweep first, the others after them in a random order.
func (a *Agent) order(sockets []string) []string {
	var first, rest []string
	for _, s := range sockets {
		if a.answered[s] {
			first = append(first, s)
		} else {
			rest = append(rest, s)
		}
	}
	rand.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	return append(first, rest...)
}

// Run sweeps every Interval (the first sweep at once) until ctx is done,
// then closes the agent's connections (Close) and returns nil. With
// Interval 0 it only waits for ctx.
func (a *Agent) Run(ctx context.Context) error {
	defer a.Close()
	if a.cfg.Interval == 0 {
		a.logger.Info("sweeping disabled (interval 0)")
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		a.SweepOnce(ctx)
		select {
		case <-ctx.Done():
			a.lastSweep(ctx)
			return nil
		case <-t.C: // a sweep longer than Interval drops ticks: sweeps never overlap
		}
	}
}

// lastSweep is one more sweep at shutdown, within Timeout, when its events
// or activation records go somewhere (OTLP, --activation-log): the
// activations that ended since the last sweep get their final from this
// agent, since the next one (started after their end) sends none.
func (a *Agent) lastSweep(ctx context.Context) {
	if a.cfg.OTel == nil && a.cfg.ActivationLog == nil {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.Timeout)
	defer cancel()
	a.SweepOnce(sctx)
}

// Handler serves /metrics and /healthz. /healthz answers 200 while sweeps
// keep completing, 503 once no sweep completed for 3 intervals plus the
// timeout (or since start), which means sweeps are stuck or far too slow.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(&sweepGatherer{sweep: a.reg, live: a.live, metrics: a.metrics}, promhttp.HandlerOpts{
		Registry:      a.live,
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", a.healthz)
	return mux
}

func (a *Agent) healthz(w http.ResponseWriter, _ *http.Request) {
	last := a.started
	if ns := a.lastDone.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	age := time.Since(last).Round(time.Millisecond)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.cfg.Interval > 0 && age > 3*a.cfg.Interval+a.cfg.Timeout {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "stale: no sweep completed for %s\n", age)
		return
	}
	if a.lastDone.Load() == 0 {
		fmt.Fprintln(w, "ok: no sweep completed yet")
		return
	}
	fmt.Fprintf(w, "ok: last sweep completed %s ago\n", age)
}

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
	// MaxContainers and CAdvisorCompat configure the per-container series
	// (metricsConfig's).
	MaxContainers int
	// LabelWorkerPool: see metricsConfig.
	LabelWorkerPool bool
	CAdvisorCompat  bool
	ActivationLog   io.Writer
	// OTel, when set, gets the metrics and the usage events over
	// OpenTelemetry (metricsConfig.OTel).
	OTel *OTel
	// StateDir, when set, keeps what the agent charged and delivered
	// across its restarts (state.go, docs/statsagent.md "Restarts").
	StateDir string
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

	seq         uint64              // sweeps polled so far
	polled      map[string]pollMemo // by socket: its last poll
	lastRefused int

	// discoveryErr is why the last sweep's discovery failed (nil once one
	// succeeds): /healthz answers 503 with it.
	discoveryErr      atomic.Pointer[error]
	discoveryFailures prometheus.Counter
}

// pollMemo is what the sweep order remembers of a daemon from the last
// sweep.
type pollMemo struct {
	// since is the sweep it was last polled in (not skipped) or, for a
	// daemon never polled, the sweep before the one that first found it:
	// how long it has waited.
	since   uint64
	skipped bool // the last sweep's bound ran out before it
	quick   bool // polled in the last sweep, answered within quickPoll of the call's bound
}

// quickPoll is the share of --timeout within which an answer counts as
// quick: quick daemons go next after those skipped last time (they cost
// the others little).
const quickPoll = 10

// New returns an Agent with its own registry (no global state).
func New(cfg Config, logger *slog.Logger) (*Agent, error) {
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.Grace < 0 || cfg.SweepTimeout < 0 {
		return nil, errors.New("agent: negative interval, timeout, sweep timeout or grace")
	}
	if _, err := sweep.Discover(cfg.Sockets); err != nil {
		return nil, err
	}
	reg, live := prometheus.NewRegistry(), prometheus.NewRegistry()
	live.MustRegister(collectors.NewGoCollector(), newProcessCollector(procRoot))
	started := time.Now()
	m, err := newStatefulMetrics(reg, metricsConfig{LabelActor: cfg.LabelActor, LabelInterface: cfg.LabelInterface, Grace: cfg.Grace,
		Started: started, EndedHorizon: cfg.EndedHorizon, MaxTemplates: cfg.MaxTemplates,
		MaxContainers: cfg.MaxContainers, CAdvisorCompat: cfg.CAdvisorCompat, LabelWorkerPool: cfg.LabelWorkerPool, ActivationLog: cfg.ActivationLog, OTel: cfg.OTel},
		cfg.StateDir, logger)
	if err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	pool := sweep.Config{Concurrency: cfg.Concurrency, Timeout: cfg.Timeout, SweepTimeout: cmp.Or(cfg.SweepTimeout, max(cfg.Interval, cfg.Timeout)),
		Limits: cfg.Limits, AllowUIDs: cfg.AllowUIDs}.NewPool()
	// Gathered at every scrape: a failing discovery completes no sweep, so
	// the sweep's cached families would not show it.
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: metricDiscoveryFailures,
		Help: "Sweeps that failed because the socket glob's directory could not be read (EMFILE, EACCES): no daemon polled."})
	if err := live.Register(failures); err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	return &Agent{cfg: cfg, logger: logger, reg: reg, live: live, metrics: m, pool: pool, started: started,
		polled: map[string]pollMemo{}, discoveryFailures: failures}, nil
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

// Settled forgets the usage events with these log.record.uid values: the
// collector took or refused them, or a full queue dropped them (the OTLP
// pipeline's Settled). Safe for concurrent use; it never takes the sweep's
// lock.
func (a *Agent) Settled(uids []string) {
	if a.metrics.pending != nil {
		a.metrics.pending.settle(uids)
	}
}

// SaveState writes the state file once more (with --state-dir): at
// shutdown, after the OTLP pipeline settled what it could, so that a
// restart does not send again what was taken.
func (a *Agent) SaveState() {
	a.metrics.mu.Lock()
	defer a.metrics.mu.Unlock()
	if a.metrics.state != nil {
		a.metrics.state.saveAgain(a.metrics.exportState(time.Now()))
	}
}

// Close closes the connections the agent keeps to its daemons (Run does
// when it returns). A later sweep dials them afresh.
func (a *Agent) Close() error { return a.pool.Close() }

// metricDiscoveryFailures counts the sweeps whose discovery failed.
const metricDiscoveryFailures = "sandboxstats_agent_discovery_failures_total"

// SweepOnce runs one sweep and makes it the exported snapshot. Every daemon
// gets its turn (order): those skipped last time first, longest waiting
// first, then the quick ones of the last sweep, then new ones, then the
// rest; a daemon goes at most ceil(N/C)-1 sweeps in a row unpolled (N
// daemons found, C = Concurrency). When the glob's directory cannot be
// read the sweep fails: the old snapshot stays, the failure is counted and
// logged, and /healthz answers 503 until a discovery succeeds.
func (a *Agent) SweepOnce(ctx context.Context) []sweep.DaemonResult {
	start := time.Now()
	d, err := sweep.DiscoverAllowed(a.cfg.Sockets, a.cfg.AllowUIDs)
	if err != nil { // the pattern was checked in New: the directory failed
		a.discoveryFailures.Inc()
		if a.discoveryErr.Swap(&err) == nil {
			a.logger.Warn("sweep failed: cannot list the daemons; /healthz answers 503 until it can", "err", err)
		}
		return nil
	}
	if a.discoveryErr.Swap(nil) != nil {
		a.logger.Info("discovery works again", "sockets", len(d.Sockets))
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
	a.remember(results)
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

// order returns sockets in the order to poll them, so that every daemon
// gets its turn however many answer slowly or hang: first the daemons the
// last sweep skipped (its bound ran out before them), those waiting since
// the oldest sweep first; then those that answered quickly in the last
// sweep (they cost the others little); then the daemons new since it; then
// the rest (polled in the last sweep, not quickly); each group by how long
// it has waited, ties in a random order.
//
// The bound: a sweep starts its first C = Concurrency daemons at once, and
// a sweep polls a prefix of its order. A daemon skipped in a sweep that
// skipped S daemons is polled within the next ceil(S/C) sweeps: the
// daemons skipped with it (or waiting longer) stay ahead of every daemon
// skipped later, a new one included, so each sweep polls at least C of
// them until it reaches it. With N daemons found, S <= N-C: no daemon goes
// more than ceil(N/C)-1 sweeps in a row unpolled, and a new one is polled
// within ceil(N/C) sweeps of being found. Before, the daemons that
// answered last time went first in sorted order (30 slow ones used up
// every sweep's bound and a healthy one after them was never polled), and
// then the quick answerers went first, so daemons answering just within
// Timeout/quickPoll could fill every sweep and never let the others in.
func (a *Agent) order(sockets []string) []string {
	// rank: 0 skipped last sweep, 1 answered quickly in it, 2 new (not
	// found before), 3 the others.
	rank := func(s string) int {
		m, ok := a.polled[s]
		switch {
		case !ok:
			return 2
		case m.skipped:
			return 0
		case m.quick:
			return 1
		}
		return 3
	}
	out := slices.Clone(sockets)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	slices.SortStableFunc(out, func(x, y string) int {
		return cmp.Or(cmp.Compare(rank(x), rank(y)), cmp.Compare(a.polled[x].since, a.polled[y].since))
	})
	return out
}

// remember notes each daemon's poll of the sweep just done for the next
// sweep's order, and forgets the sockets it no longer found.
func (a *Agent) remember(results []sweep.DaemonResult) {
	seen := make(map[string]pollMemo, len(results))
	for _, r := range results {
		m, ok := a.polled[r.Socket]
		if !ok {
			m.since = a.seq // found now: waiting since the sweep before
		}
		m.skipped = r.Status == sweep.StatusSkipped
		m.quick = false
		if !m.skipped {
			answered := r.Status == sweep.StatusOK || r.Status == sweep.StatusNoSample
			m.since, m.quick = a.seq+1, answered && r.Took <= a.cfg.Timeout/quickPoll
		}
		seen[r.Socket] = m
	}
	a.seq++
	a.polled = seen
}

// Run sweeps every Interval (the first sweep at once) until ctx is done,
// then closes the agent's connections (Close) and returns nil. With
// Interval 0 it only waits for ctx.
func (a *Agent) Run(ctx context.Context) error {
	defer a.Close()
	a.metrics.resendPending(time.Now())
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
// timeout (or since start), which means sweeps are stuck or far too slow,
// and 503 while the last sweep's discovery failed (the reason follows).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", a.metricsHandler())
	mux.HandleFunc("/healthz", a.healthz)
	return mux
}

// metricsHandler serves /metrics: each sweep encoded once (scrapeHandler)
// over today's promhttp handler.
func (a *Agent) metricsHandler() *scrapeHandler {
	g := &sweepGatherer{sweep: a.reg, live: a.live, metrics: a.metrics}
	return newScrapeHandler(promhttp.HandlerFor(g, promhttp.HandlerOpts{
		Registry:      a.live,
		ErrorHandling: promhttp.ContinueOnError,
	}), g)
}

func (a *Agent) healthz(w http.ResponseWriter, _ *http.Request) {
	last := a.started
	if ns := a.lastDone.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	age := time.Since(last).Round(time.Millisecond)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := a.discoveryErr.Load(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "discovery failing: %v\n", *err)
		return
	}
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

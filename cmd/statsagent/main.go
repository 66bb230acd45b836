// Command statsagent is the reference node agent of sandboxstats: every
// --interval it discovers the statsd daemons of a node from a socket glob,
// polls each with StatsActiveWorkloads (bounded per call and in
// concurrency), and serves the latest sweep as Prometheus metrics on
// --metrics-listen (/metrics, and /healthz for its own health).
//
// See docs/statsagent.md.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxstats/sandboxstats/internal/cli"
	"github.com/sandboxstats/sandboxstats/internal/exepages"
	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
	_ "github.com/sandboxstats/sandboxstats/internal/oneproc" // one Go processor (its doc)
	"github.com/sandboxstats/sandboxstats/internal/otlp"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/version"
)

const exitStatusHelp = `
Exit status: 0 after a clean shutdown (SIGINT, SIGTERM), --help or --version;
1 when serving failed; 2 for a usage error (unknown flag, bad value).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(exitStatus(err, os.Stdout, os.Stderr))
}

// exitStatus prints what run's err asks for and returns the exit status
// (cli.ExitStatus).
func exitStatus(err error, stdout, stderr io.Writer) int {
	return cli.ExitStatus("statsagent", err, stdout, stderr)
}

type options struct {
	agent           nodeagent.Config
	activationLog   string
	allowUIDs       string
	minInterval     time.Duration
	listen          string
	maxConns        int
	maxInFlight     int
	logLevel        slog.Level
	shutdownTimeout time.Duration
	otlp            otlp.Config
	otlpHeaders     headerFlag
	otlpPeriodic    int
	nodeName        string
}

// headerFlag is a repeatable NAME=VALUE flag.
type headerFlag map[string]string

func (h *headerFlag) String() string { return "" }

func (h *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("%q: want NAME=VALUE", v)
	}
	if *h == nil {
		*h = headerFlag{}
	}
	(*h)[strings.TrimSpace(name)] = value
	return nil
}

// parseFlags turns args into options. Warnings (a clamped interval) go to
// warn once the logger exists. Every error is a cli.UsageError, flag.ErrHelp or
// cli.ErrVersion.
func parseFlags(args []string, stderr io.Writer) (options, []string, error) {
	o, warnings, err := parseFlagsOnly(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, cli.ErrVersion) {
		return o, nil, cli.UsageError{Err: err}
	}
	return o, warnings, err
}

func parseFlagsOnly(args []string, stderr io.Writer) (options, []string, error) {
	o := options{agent: nodeagent.Config{Sockets: "/run/statsd/*.sock"}}
	var showVersion bool
	fs := flag.NewFlagSet("statsagent", flag.ContinueOnError)
	// The flag package would print a usage error and the whole usage; main
	// prints the error once, and --help prints the usage below.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.Var(sockaddr.Flag{Path: &o.agent.Sockets}, "sockets", "glob of the statsd stats sockets to poll, re-read at every sweep: a `glob`, unix:GLOB or unix:///GLOB")
	fs.DurationVar(&o.agent.Interval, "interval", time.Minute, "time between sweeps; 0 disables sweeping")
	fs.DurationVar(&o.minInterval, "min-interval", 15*time.Second, "floor of --interval; a lower non-zero --interval is raised to it with a warning")
	fs.DurationVar(&o.agent.Timeout, "timeout", 10*time.Second, "bound of each StatsActiveWorkloads call")
	fs.IntVar(&o.agent.Concurrency, "concurrency", 8, "most daemons polled at once")
	fs.StringVar(&o.listen, "metrics-listen", "127.0.0.1:9477", "TCP address serving /metrics and /healthz")
	fs.IntVar(&o.maxConns, "metrics-max-connections", 64, "most connections to --metrics-listen open at once; more are closed on accept and counted")
	fs.IntVar(&o.maxInFlight, "metrics-max-requests", 4, "most scrapes of /metrics served at once; more are answered 503 at once and counted")
	fs.BoolVar(&o.agent.LabelActor, "label-actor", false, "add actor_uid, actor_name, actor_namespace labels (one series per workload: high cardinality)")
	fs.BoolVar(&o.agent.LabelInterface, "label-interface", false, "export the network counters per interface (an interface label, at most 16 interfaces a workload) instead of their total")
	fs.DurationVar(&o.agent.SweepTimeout, "sweep-timeout", 0, "bound of a whole sweep; daemons not polled within it are skipped (0: the larger of --interval and --timeout)")
	fs.StringVar(&o.allowUIDs, "allow-socket-uids", "", "comma-separated `uids` a socket's owner and its server may have (default: root and the agent's own uid)")
	fs.IntVar(&o.agent.Limits.MaxSamples, "max-samples", sweep.DefaultLimits.MaxSamples, "most samples one daemon may answer; a longer answer is dropped")
	fs.IntVar(&o.agent.Limits.MaxFindings, "max-findings", sweep.DefaultLimits.MaxFindings, "most drift findings one daemon may list; more are dropped")
	fs.IntVar(&o.agent.Limits.MaxEnded, "max-ended", sweep.DefaultLimits.MaxEnded, "most ended activations read from one daemon in a sweep, over every page (and most pages); more are dropped")
	fs.IntVar(&o.agent.Limits.MaxReplyBytes, "max-reply-bytes", sweep.DefaultLimits.MaxReplyBytes, "largest answer accepted from a daemon, and most bytes of ended-activation pages read from one daemon in a sweep")
	fs.DurationVar(&o.agent.Grace, "grace", 10*time.Minute, "how long a workload's CPU counter is remembered after it was last seen; raised to at least 2 x --interval + --timeout")
	fs.StringVar(&o.activationLog, "activation-log", "", "append one JSON line per ended activation (identity, epoch, end, CPU, peak, outcome, final provenance) to this file, or - for stdout")
	fs.DurationVar(&o.agent.EndedHorizon, "ended-horizon", time.Hour, "how long an ended activation is remembered so it is charged once, and a template's per-activation series after its last activation ended; must exceed statsd's --ended-retention")
	fs.StringVar(&o.agent.StateDir, "state-dir", "", "keep what was charged and delivered in this directory (agent-state.json), so that a restarted agent continues every counter and sends every usage event not yet taken (docs/statsagent.md, \"Restarts and delivery\"); empty: none, a restart starts afresh")
	fs.IntVar(&o.agent.MaxTemplates, "max-templates", nodeagent.DefaultMaxTemplates, "most templates exported by name at a time (Prometheus and OTLP); the others are exported as template (other) and counted in sandboxstats_agent_templates_folded_total")
	fs.IntVar(&o.agent.MaxContainers, "max-containers", nodeagent.DefaultMaxContainers, "most containers of one workload exported by name (the container label); the others are exported as container (other) and counted in sandboxstats_agent_containers_folded_total")
	fs.BoolVar(&o.agent.LabelWorkerPool, "label-worker-pool", false, "add the worker_pool label (the identity's worker pool, empty for none) to the workload and container metrics, beside the template labels (few values: no per-workload cost)")
	fs.BoolVar(&o.agent.CAdvisorCompat, "cadvisor-compat", false, "also serve the per-container figures on /metrics under cAdvisor's names and labels (container_cpu_usage_seconds_total{namespace,pod,container}, container_memory_working_set_bytes, container_memory_usage_bytes): see docs/statsagent.md")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 5*time.Second, "how long shutdown waits for scrapes in flight")
	fs.StringVar(&o.otlp.Endpoint, "otlp-endpoint", "", "also push metrics and usage events over OTLP to this OpenTelemetry Collector: http://HOST:PORT (plaintext), https://HOST:PORT (TLS) or unix:///PATH; off when empty (Prometheus is served either way)")
	fs.StringVar(&o.otlp.Protocol, "otlp-protocol", otlp.ProtocolGRPC, "OTLP transport: grpc or http/protobuf")
	fs.StringVar(&o.otlp.CAFile, "otlp-ca-file", "", "PEM CA certificates that verify an https:// collector (default: the system's roots)")
	fs.StringVar(&o.otlp.CertFile, "otlp-client-cert", "", "PEM client certificate for an https:// collector (with --otlp-client-key)")
	fs.StringVar(&o.otlp.KeyFile, "otlp-client-key", "", "PEM key of --otlp-client-cert")
	fs.Var(&o.otlpHeaders, "otlp-header", "`NAME=VALUE` sent with every OTLP export (repeatable), e.g. an authorization header")
	fs.DurationVar(&o.otlp.Timeout, "otlp-timeout", otlp.DefaultTimeout, "bound of each OTLP export")
	fs.IntVar(&o.otlp.QueueRecords, "otlp-queue-events", otlp.DefaultQueueRecords, "most usage events waiting to be sent; more are dropped and counted (initial and periodic ones may fill three quarters)")
	fs.IntVar(&o.otlp.QueueBytes, "otlp-queue-bytes", otlp.DefaultQueueBytes, "most bytes of usage events waiting to be sent; more are dropped and counted")
	fs.IntVar(&o.otlpPeriodic, "otlp-periodic-every", 1, "send a periodic usage event of every workload at every Nth sweep; 0: none (initial and final events are always sent)")
	fs.StringVar(&o.nodeName, "node-name", "", "the node's name on the OTLP resource (k8s.node.name; default $NODE_NAME)")
	fs.BoolVar(&showVersion, "version", false, "print the version (module, VCS revision and time, Go) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: statsagent [flags]\n\nPolls every statsd on the node and serves Prometheus metrics (/metrics, /healthz);\nwith --otlp-endpoint it also pushes them, and a usage event per activation, over OTLP.\n\nFlags:\n")
			fs.PrintDefaults()
			fmt.Fprint(stderr, exitStatusHelp)
		}
		return o, nil, err
	}
	if showVersion {
		return o, nil, cli.ErrVersion
	}
	if fs.NArg() > 0 {
		return o, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.agent.Interval < 0 || o.minInterval < 0:
		return o, nil, errors.New("--interval and --min-interval must not be negative")
	case o.agent.Timeout <= 0:
		return o, nil, errors.New("--timeout must be positive")
	case o.agent.Concurrency < 1:
		return o, nil, errors.New("--concurrency must be at least 1")
	case o.maxConns < 1 || o.maxInFlight < 1:
		return o, nil, errors.New("--metrics-max-connections and --metrics-max-requests must be positive")
	case o.agent.Grace < 0:
		return o, nil, errors.New("--grace must not be negative")
	case o.agent.EndedHorizon <= 0:
		return o, nil, errors.New("--ended-horizon must be positive")
	case o.agent.MaxContainers < 1:
		return o, nil, errors.New("--max-containers must be at least 1")
	case o.agent.MaxTemplates < 1:
		return o, nil, errors.New("--max-templates must be at least 1")
	case o.agent.SweepTimeout < 0:
		return o, nil, errors.New("--sweep-timeout must not be negative")
	case o.otlp.Timeout <= 0 || o.otlp.QueueRecords < 1 || o.otlp.QueueBytes < 1:
		return o, nil, errors.New("--otlp-timeout, --otlp-queue-events and --otlp-queue-bytes must be positive")
	case o.otlpPeriodic < 0:
		return o, nil, errors.New("--otlp-periodic-every must not be negative")
	case o.agent.Limits.MaxSamples < 1 || o.agent.Limits.MaxFindings < 1 || o.agent.Limits.MaxEnded < 1 || o.agent.Limits.MaxReplyBytes < 1:
		return o, nil, errors.New("--max-samples, --max-findings, --max-ended and --max-reply-bytes must be positive")
	}
	if o.otlp.Endpoint != "" {
		if _, err := otlp.ParseEndpoint(o.otlp.Endpoint); err != nil {
			return o, nil, fmt.Errorf("--otlp-endpoint: %w", err)
		}
	}
	o.otlp.Headers = o.otlpHeaders
	if o.allowUIDs != "" {
		for _, f := range strings.Split(o.allowUIDs, ",") {
			uid, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
			if err != nil {
				return o, nil, fmt.Errorf("--allow-socket-uids: %q is not a uid", f)
			}
			o.agent.AllowUIDs = append(o.agent.AllowUIDs, uint32(uid))
		}
	}
	var warnings []string
	if o.agent.Interval > 0 && o.agent.Interval < o.minInterval {
		warnings = append(warnings, fmt.Sprintf("--interval %s is below --min-interval; using %s", o.agent.Interval, o.minInterval))
		o.agent.Interval = o.minInterval
	}
	if o.agent.Interval > 0 && o.agent.Timeout >= o.agent.Interval {
		warnings = append(warnings, fmt.Sprintf("--timeout %s is not below --interval %s: a hung daemon makes sweeps skip ticks", o.agent.Timeout, o.agent.Interval))
	}
	// A workload is seen once per sweep, and sweeps end up to an interval
	// plus a sweep's length apart: a grace shorter than that forgets every
	// workload before its next sample, so every sample is a first sight and
	// no CPU is ever charged. With sweeps no longer than one timeout, twice
	// the interval plus the timeout also survives one sweep that missed it.
	if floor := 2*o.agent.Interval + o.agent.Timeout; o.agent.Interval > 0 && o.agent.Grace < floor {
		warnings = append(warnings, fmt.Sprintf("--grace %s is below 2 x --interval + --timeout: a workload would be forgotten between sweeps and never charged CPU; using %s",
			o.agent.Grace, floor))
		o.agent.Grace = floor
	}
	return o, warnings, nil
}

// resourceAttrs describe this agent on the OTLP resource.
func resourceAttrs(node string) []attribute.KeyValue {
	kv := []attribute.KeyValue{attribute.String("service.name", "statsagent"), attribute.String("service.version", cmp.Or(version.Get().Revision, version.Get().Version))}
	if h, err := os.Hostname(); err == nil {
		kv = append(kv, attribute.String("host.name", h))
	}
	if node != "" {
		kv = append(kv, attribute.String("k8s.node.name", node))
	}
	return kv
}

// allowed describes the allowed uids for the log.
func allowed(uids []uint32) string {
	if uids == nil {
		uids = sweep.DefaultAllowedUIDs()
	}
	return strings.Trim(fmt.Sprint(uids), "[]")
}

// run is statsagent: it returns nil after a clean shutdown when ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, warnings, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	for _, w := range warnings {
		logger.Warn(w)
	}
	switch o.activationLog {
	case "":
	case "-":
		o.agent.ActivationLog = os.Stdout
	default:
		f, err := os.OpenFile(o.activationLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return fmt.Errorf("activation log: %w", err)
		}
		defer f.Close()
		o.agent.ActivationLog = f
	}
	var pipeline *otlp.Pipeline
	// The agent hears of each event the pipeline settled (its state keeps
	// the others, to send again after a restart); made after the pipeline.
	var agent atomic.Pointer[nodeagent.Agent]
	o.otlp.Settled = func(uids []string) {
		if a := agent.Load(); a != nil {
			a.Settled(uids)
		}
	}
	if o.otlp.Endpoint != "" {
		o.otlp.Resource = resourceAttrs(cmp.Or(o.nodeName, os.Getenv("NODE_NAME")))
		dists := nodeagent.NewDistributions()
		o.otlp.CardinalityLimit, o.otlp.Producer = nodeagent.OTelPipelineCardinalityLimit(o.agent.MaxTemplates, o.agent.MaxContainers), dists
		pipeline, err = otlp.New(o.otlp, logger.With("component", "otlp"))
		if err != nil {
			return err
		}
		o.agent.OTel = &nodeagent.OTel{Meters: pipeline.Meters(), Loggers: pipeline.Loggers(), PeriodicEvery: o.otlpPeriodic, Swept: pipeline.Swept,
			Distributions: dists}
	}
	a, err := nodeagent.New(o.agent, logger.With("component", "agent"))
	if err != nil {
		return err
	}
	agent.Store(a)
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	ms := newMetricsServer(ln, a.Handler(), o.maxConns, o.maxInFlight, logger.With("component", "http"))
	srv := ms.srv
	live := ms.Collectors()
	if pipeline != nil {
		live = append(live, pipeline.Collectors()...)
	}
	if err := a.RegisterLive(live...); err != nil {
		ln.Close()
		return err
	}
	logger.Info("statsagent serving", "addr", ln.Addr().String(), "sockets", o.agent.Sockets,
		"interval", o.agent.Interval, "timeout", o.agent.Timeout, "concurrency", o.agent.Concurrency,
		"label_actor", o.agent.LabelActor, "cadvisor_compat", o.agent.CAdvisorCompat, "label_interface", o.agent.LabelInterface, "grace", o.agent.Grace,
		"allow_socket_uids", allowed(o.agent.AllowUIDs), "metrics_max_connections", o.maxConns, "metrics_max_requests", o.maxInFlight)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := ms.Serve(); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	})
	// The pipeline stops after the agent: the agent's last sweep at
	// shutdown still sends its finals.
	pctx, stopPipeline := context.WithCancel(context.WithoutCancel(gctx))
	defer stopPipeline()
	g.Go(func() error {
		defer stopPipeline()
		return a.Run(gctx)
	})
	g.Go(func() error {
		exepages.ReleaseAfter(gctx, exepages.DefaultProcRoot, exepages.DefaultDelay, logger)
		return nil
	})
	if pipeline != nil {
		logger.Info("pushing OTLP", "endpoint", o.otlp.Endpoint, "protocol", o.otlp.Protocol, "periodic_every", o.otlpPeriodic)
		g.Go(func() error { return pipeline.Run(pctx) })
	}
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), o.shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
			return fmt.Errorf("metrics server shutdown: %w", err)
		}
		return nil
	})
	err = g.Wait()
	a.SaveState() // the pipeline settled what it could: not sent again
	logger.Info("statsagent stopped", "err", err)
	return err
}

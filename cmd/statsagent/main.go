// Command statsagent is the reference node agent of sandboxstats: every
// --interval it discovers the statsd daemons of a node from a socket glob,
// polls each with StatsActiveWorkloads (bounded per call and in
// concurrency), and serves the latest sweep as Prometheus metrics on
// --metrics-listen (/metrics, and /healthz for its own health).
//
// See docs/statsagent.md.
package main

import (
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
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
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

// exitStatus prints what run's err asks for (the version, or the error
// once, a usage error with a pointer to --help) and returns the exit status.
func exitStatus(err error, stdout, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprint(stdout, version.Get().Text("statsagent"))
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "statsagent: %v\nRun statsagent --help for the flags.\n", err)
		return 2
	default:
		fmt.Fprintln(stderr, "statsagent:", err)
		return 1
	}
}

// usageError is a command-line mistake: exit status 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// errVersion is what run returns for --version: main prints the version.
var errVersion = errors.New("version requested")

type options struct {
	agent           nodeagent.Config
	activationLog   string
	allowUIDs       string
	minInterval     time.Duration
	listen          string
	logLevel        slog.Level
	shutdownTimeout time.Duration
}

// parseFlags turns args into options. Warnings (a clamped interval) go to
// warn once the logger exists. Every error is a usageError, flag.ErrHelp or
// errVersion.
func parseFlags(args []string, stderr io.Writer) (options, []string, error) {
	o, warnings, err := parseFlagsOnly(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errVersion) {
		return o, nil, usageError{err}
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
	fs.DurationVar(&o.agent.EndedHorizon, "ended-horizon", time.Hour, "how long an ended activation is remembered so it is charged once; must exceed statsd's --ended-retention")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 5*time.Second, "how long shutdown waits for scrapes in flight")
	fs.BoolVar(&showVersion, "version", false, "print the version (module, VCS revision and time, Go) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: statsagent [flags]\n\nPolls every statsd on the node and serves Prometheus metrics (/metrics, /healthz).\n\nFlags:\n")
			fs.PrintDefaults()
			fmt.Fprint(stderr, exitStatusHelp)
		}
		return o, nil, err
	}
	if showVersion {
		return o, nil, errVersion
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
	case o.agent.Grace < 0:
		return o, nil, errors.New("--grace must not be negative")
	case o.agent.EndedHorizon <= 0:
		return o, nil, errors.New("--ended-horizon must be positive")
	case o.agent.SweepTimeout < 0:
		return o, nil, errors.New("--sweep-timeout must not be negative")
	case o.agent.Limits.MaxSamples < 1 || o.agent.Limits.MaxFindings < 1 || o.agent.Limits.MaxEnded < 1 || o.agent.Limits.MaxReplyBytes < 1:
		return o, nil, errors.New("--max-samples, --max-findings, --max-ended and --max-reply-bytes must be positive")
	}
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
	a, err := nodeagent.New(o.agent, logger.With("component", "agent"))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	srv := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("statsagent serving", "addr", ln.Addr().String(), "sockets", o.agent.Sockets,
		"interval", o.agent.Interval, "timeout", o.agent.Timeout, "concurrency", o.agent.Concurrency,
		"label_actor", o.agent.LabelActor, "label_interface", o.agent.LabelInterface, "grace", o.agent.Grace,
		"allow_socket_uids", allowed(o.agent.AllowUIDs))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	})
	g.Go(func() error { return a.Run(gctx) })
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
	logger.Info("statsagent stopped", "err", err)
	return err
}

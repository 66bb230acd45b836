// Command statsnri is the NRI bridge of sandboxstats: a node plugin of
// containerd (or CRI-O) that keeps the bindings of the node's statsd
// daemons equal to the node's pods of the runtime handlers it watches
// (gVisor, Kata), with no launcher calling statsd. It binds a pod
// (RunWorkload) when NRI says it runs, checkpoints it (CheckpointWorkload)
// when it stops or is removed, and reconciles both ways at every
// (re)connect; it answers every NRI event at once and calls statsd
// asynchronously. It serves its counters and its health on
// --metrics-listen (/metrics, /healthz).
//
// See docs/nri.md.
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
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxstats/sandboxstats/internal/cli"
	"github.com/sandboxstats/sandboxstats/internal/exepages"
	"github.com/sandboxstats/sandboxstats/internal/nribridge"
	"github.com/sandboxstats/sandboxstats/internal/peercred"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
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
	return cli.ExitStatus("statsnri", err, stdout, stderr)
}

type options struct {
	bridge          nribridge.Options
	connect         nribridge.ConnectOptions
	listen          string
	keyFile         string
	logLevel        slog.Level
	shutdownTimeout time.Duration
}

// statsdFlag is the repeatable --statsd LIFECYCLE,STATS.
type statsdFlag struct{ list *[]nribridge.Statsd }

func (f statsdFlag) String() string {
	if f.list == nil {
		return ""
	}
	var s []string
	for _, sd := range *f.list {
		s = append(s, sd.Lifecycle+","+sd.Stats)
	}
	return strings.Join(s, " ")
}

func (f statsdFlag) Set(v string) error {
	lc, st, ok := strings.Cut(v, ",")
	if !ok {
		return fmt.Errorf("%q: want LIFECYCLE_SOCKET,STATS_SOCKET", v)
	}
	var sd nribridge.Statsd
	var err error
	if sd.Lifecycle, err = sockaddr.Parse(lc); err != nil {
		return err
	}
	if sd.Stats, err = sockaddr.Parse(st); err != nil {
		return err
	}
	for _, o := range *f.list {
		if o.Lifecycle == sd.Lifecycle || o.Stats == sd.Stats {
			return fmt.Errorf("%q: that statsd is given twice", v)
		}
	}
	*f.list = append(*f.list, sd)
	return nil
}

// listFlag is a comma-separated list.
type listFlag struct{ list *[]string }

func (f listFlag) String() string {
	if f.list == nil {
		return ""
	}
	return strings.Join(*f.list, ",")
}

func (f listFlag) Set(v string) error {
	*f.list = nil
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*f.list = append(*f.list, s)
		}
	}
	return nil
}

// sourcesFlag is --template-from.
type sourcesFlag struct{ list *[]nribridge.Source }

func (f sourcesFlag) String() string {
	if f.list == nil {
		return ""
	}
	var s []string
	for _, src := range *f.list {
		s = append(s, src.String())
	}
	return strings.Join(s, ",")
}

func (f sourcesFlag) Set(v string) error {
	*f.list = nil
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		src, err := nribridge.ParseSource(s)
		if err != nil {
			return err
		}
		*f.list = append(*f.list, src)
	}
	return nil
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o, err := parseFlagsOnly(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, cli.ErrVersion) {
		return o, cli.UsageError{Err: err}
	}
	return o, err
}

func parseFlagsOnly(args []string, stderr io.Writer) (options, error) {
	o := options{
		bridge: nribridge.Options{
			Mapping: nribridge.Config{
				Handlers:       []string{"runsc", "kata*"},
				GVisorHandlers: []string{"runsc*"},
				KataHandlers:   []string{"kata*"},
				DefaultRuntime: "runc",
				Templates: []nribridge.Source{
					{Annotation: true, Key: "sandboxstats.dev/template"},
					{Key: "sandboxstats.dev/template"},
				},
			},
			Kata: nribridge.KataLayout{Root: nribridge.DefaultKataRoot},
		},
		connect: nribridge.ConnectOptions{Socket: "/var/run/nri/nri.sock"},
	}
	var showVersion bool
	var allowUIDs string
	fs := flag.NewFlagSet("statsnri", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	b := &o.bridge
	fs.Var(sockaddr.Flag{Path: &o.connect.Socket}, "nri-socket", "NRI's socket (containerd's [plugins.\"io.containerd.nri.v1.nri\"] socket_path): a `path`, unix:PATH or unix:///PATH")
	fs.Var(statsdFlag{&b.Statsd}, "statsd", "a statsd the pods are spread over, as its lifecycle and stats sockets `LIFECYCLE,STATS` (each a path, unix:PATH or unix:///PATH); repeat for each, in the same order on every start (a pod's statsd is a keyed hash of its uid over this list)")
	fs.Var(listFlag{&b.Mapping.Handlers}, "handlers", "comma-separated `globs` of the runtime handlers whose pods are bound (the RuntimeClass handlers; an empty handler is --default-runtime's name)")
	fs.Var(listFlag{&b.Mapping.GVisorHandlers}, "gvisor-handlers", "comma-separated `globs` of the watched handlers that are gVisor: bound by the sentry's pid")
	fs.Var(listFlag{&b.Mapping.KataHandlers}, "kata-handlers", "comma-separated `globs` of the watched handlers that are Kata: bound by the guest agent's address from --kata-root; any other watched handler is bound by the pod's cgroup")
	fs.StringVar(&b.Mapping.DefaultRuntime, "default-runtime", b.Mapping.DefaultRuntime, "the handler `name` a pod without a runtime handler runs with (containerd's default_runtime_name)")
	fs.Var(sourcesFlag{&b.Mapping.Templates}, "template-from", "where a pod's template is read, first present wins: comma-separated `sources`, each label:KEY or annotation:KEY, whose value is namespace/name or name (the namespace then the pod's)")
	fs.StringVar(&b.Kata.Root, "kata-root", b.Kata.Root, "Kata's run `directory` (persist.json and hybrid-vsock sockets per sandbox), mounted at the host's path")
	fs.DurationVar(&b.CallTimeout, "call-timeout", 10*time.Second, "bound of each call to a statsd")
	fs.DurationVar(&b.Resync, "resync", 5*time.Minute, "how often every statsd is listed and made to hold exactly its running pods, and NRI reconnected for a fresh Synchronize while pods known from one only are tracked (their end may go unannounced); 0: only at each NRI connect")
	fs.IntVar(&b.MaxPods, "max-pods", 1024, "most pods tracked")
	fs.StringVar(&o.keyFile, "placement-key-file", "/var/lib/statsnri/placement.key", "the per-node secret `file` that keys the pods' placement over --statsd (32 random bytes, made with mode 0600 if absent; refused if group or others may read it or it is not root's or the bridge's): keep it across restarts")
	fs.IntVar(&b.NamespaceCap, "namespace-cap", 16, "most pods of one namespace placed on one statsd, the rest going to the next of their order; 0: no cap")
	fs.StringVar(&allowUIDs, "allow-statsd-uids", "", "comma-separated `uids` a statsd may run as (default: root and the bridge's own uid)")
	fs.StringVar(&o.listen, "metrics-listen", "127.0.0.1:9478", "TCP `address` serving /metrics and /healthz (200 once connected to NRI and synchronized, else 503); empty: none")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 5*time.Second, "how long shutdown waits for scrapes in flight")
	fs.BoolVar(&showVersion, "version", false, "print the version (module, VCS revision and time, Go) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: statsnri --statsd LIFECYCLE,STATS [--statsd ...] [flags]\n\n"+
				"Binds the node's pods of the watched runtime handlers to statsd from containerd's pod lifecycle (NRI),\n"+
				"keeps each pod's container set (id, name) current from its container events (UpdateWorkloadContainers),\n"+
				"and serves its counters and health (/metrics, /healthz).\n\nFlags:\n")
			fs.PrintDefaults()
			fmt.Fprint(stderr, exitStatusHelp)
		}
		return o, err
	}
	if showVersion {
		return o, cli.ErrVersion
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case len(b.Statsd) == 0:
		return o, errors.New("--statsd is required: the statsd daemons to bind pods on")
	case len(b.Mapping.Handlers) == 0:
		return o, errors.New("--handlers is empty: no pod would be bound")
	case b.CallTimeout <= 0:
		return o, errors.New("--call-timeout must be positive")
	case b.Resync < 0:
		return o, errors.New("--resync must not be negative")
	case b.MaxPods < 1:
		return o, errors.New("--max-pods must be positive")
	case o.keyFile == "":
		return o, errors.New("--placement-key-file is required: the placement must be the same on every start")
	case b.NamespaceCap < 0:
		return o, errors.New("--namespace-cap must not be negative")
	}
	if err := b.Mapping.Validate(); err != nil {
		return o, err
	}
	if b.Resync == 0 {
		b.Resync = -1 // nribridge: only after each Synchronize
	}
	if allowUIDs != "" {
		ids, err := peercred.ParseIDs(allowUIDs)
		if err != nil {
			return o, fmt.Errorf("--allow-statsd-uids: %w", err)
		}
		b.AllowUIDs = ids
	}
	return o, nil
}

// run is statsnri: it returns nil after a clean shutdown when ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.bridge.PlacementKey, err = nribridge.LoadPlacementKey(o.keyFile); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	reg := prometheus.NewRegistry()
	o.bridge.Logger = logger.With("component", "nri")
	o.bridge.Registerer = reg
	b, err := nribridge.New(o.bridge)
	if err != nil {
		return err
	}
	var ln net.Listener
	if o.listen != "" {
		if ln, err = net.Listen("tcp", o.listen); err != nil {
			return fmt.Errorf("metrics listener %s: %w", o.listen, err)
		}
	}
	var statsd []string
	for _, sd := range o.bridge.Statsd {
		statsd = append(statsd, sd.Lifecycle+","+sd.Stats)
	}
	addr := ""
	if ln != nil {
		addr = ln.Addr().String()
	}
	m := o.bridge.Mapping
	logger.Info("statsnri serving", "addr", addr, "nri_socket", o.connect.Socket, "statsd", strings.Join(statsd, " "),
		"handlers", strings.Join(m.Handlers, ","), "gvisor_handlers", strings.Join(m.GVisorHandlers, ","),
		"kata_handlers", strings.Join(m.KataHandlers, ","), "default_runtime", m.DefaultRuntime,
		"template_from", sourcesFlag{&m.Templates}.String(), "kata_root", o.bridge.Kata.Root,
		"placement_key_file", o.keyFile, "namespace_cap", o.bridge.NamespaceCap)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return b.Run(gctx) })
	g.Go(func() error { return b.Connect(gctx, o.connect) })
	g.Go(func() error {
		exepages.ReleaseAfter(gctx, exepages.DefaultProcRoot, exepages.DefaultDelay, logger)
		return nil
	})
	if ln != nil {
		srv := &http.Server{
			Handler:           handler(b, reg),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
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
	}
	err = g.Wait()
	logger.Info("statsnri stopped", "err", err)
	return err
}

// handler serves /metrics and /healthz.
func handler(b *nribridge.Bridge, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	// Uncompressed: a few dozen lines, where each gzipped scrape allocated
	// a compressor of about 1 MiB that the idle bridge kept (docs/design.md, "Memory").
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{DisableCompression: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, detail := b.Health()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, detail)
	})
	return mux
}

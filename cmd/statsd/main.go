// Command statsd is the per-sandbox stats daemon. The launcher tells it, on
// its lifecycle socket, which workload runs in the sandbox and where to
// measure it; pollers read that workload's memory and CPU on its stats socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/version"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

type config struct {
	listen          string
	lifecycleListen string
	stateDir        string
	procRoot        string
	cgroupRoot      string
	debugfsRoot     string
	readTimeout     time.Duration
	shutdownTimeout time.Duration
	driftInterval   time.Duration
	driftGrace      time.Duration
	endedRetention  time.Duration
	endedMax        int
	logLevel        slog.Level
}

// usageError is a command-line mistake: exit status 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// errVersion is what run returns for --version: main prints the version.
var errVersion = errors.New("version requested")

// parseFlags parses the command line; every error it returns is a
// usageError, flag.ErrHelp or errVersion.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	c, err := parseFlagsOnly(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errVersion) {
		return c, usageError{err}
	}
	return c, err
}

func parseFlagsOnly(args []string, stderr io.Writer) (config, error) {
	c := config{listen: "/run/statsd/statsd.sock", lifecycleListen: "/run/statsd/lifecycle/statsd.sock"}
	var showVersion bool
	fs := flag.NewFlagSet("statsd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(sockaddr.Flag{Path: &c.listen}, "listen", "Unix socket for the read-only stats service (mode 0660): a `path`, unix:PATH or unix:///PATH")
	fs.Var(sockaddr.Flag{Path: &c.lifecycleListen}, "lifecycle-listen", "Unix socket for the launcher's lifecycle service (mode 0600), spelled as --listen; kept out of the stats sockets' directory so a node agent's glob never matches it")
	fs.StringVar(&c.stateDir, "state-dir", "/var/lib/statsd", "directory holding the bound workload across restarts")
	fs.StringVar(&c.procRoot, "proc-root", "/proc", "mount point of procfs")
	fs.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "mount point of the cgroup file system(s)")
	fs.StringVar(&c.debugfsRoot, "debugfs-root", "/sys/kernel/debug", "mount point of debugfs (KVM counters)")
	fs.DurationVar(&c.readTimeout, "read-timeout", 2*time.Second, "bound of every read (file, agent call, pid file)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long graceful shutdown may take before a hard stop")
	fs.DurationVar(&c.driftInterval, "drift-interval", 5*time.Minute, "how often to check that the bound sandbox still matches what runs; 0 turns the check off")
	fs.DurationVar(&c.driftGrace, "drift-grace", 15*time.Minute, "after a Run/Restore, how long before the drift check looks (also how long an agent may stay silent)")
	fs.DurationVar(&c.endedRetention, "ended-retention", identity.DefaultEndedRetention, "how long an ended activation's record (its final sample) is kept for pollers")
	fs.IntVar(&c.endedMax, "ended-max", identity.DefaultEndedMax, "most ended-activation records kept (the oldest go first)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	fs.BoolVar(&showVersion, "version", false, "print the version (module, VCS revision and time, Go) and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: statsd [flags]\n\nServes one sandbox's workload stats over gRPC on Unix sockets.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), exitStatusHelp)
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if showVersion {
		return c, errVersion
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if c.readTimeout <= 0 {
		return c, errors.New("--read-timeout must be positive")
	}
	if c.endedRetention <= 0 || c.endedMax <= 0 {
		return c, errors.New("--ended-retention and --ended-max must be positive")
	}
	if c.listen == c.lifecycleListen {
		return c, errors.New("--listen and --lifecycle-listen must differ")
	}
	return c, nil
}

const exitStatusHelp = `
Exit status: 0 after a clean shutdown (SIGINT, SIGTERM), --help or --version;
1 when serving failed; 2 for a usage error (unknown flag, bad value).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errVersion):
		fmt.Print(version.Get().Text("statsd"))
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "statsd:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "statsd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))

	store, err := identity.NewStore(identity.Config{
		StateDir:       cfg.stateDir,
		Open:           opener(cfg, logger),
		Logger:         logger.With("component", "identity"),
		ReadTimeout:    cfg.readTimeout,
		EndedRetention: cfg.endedRetention,
		EndedMax:       cfg.endedMax,
	})
	if err != nil {
		return err
	}
	defer store.Close()

	statsLis, removeStats, err := listenUnix(cfg.listen, 0o755, 0o660)
	if err != nil {
		return err
	}
	defer removeStats()
	lifeLis, removeLife, err := listenUnix(cfg.lifecycleListen, 0o700, 0o600)
	if err != nil {
		return err
	}
	defer removeLife()

	checker, err := drift.New(drift.Config{
		Store:    store,
		Observer: drift.NewSystemObserver(cfg.procRoot, cfg.readTimeout, cfg.driftGrace, nil),
		Interval: cfg.driftInterval,
		Grace:    cfg.driftGrace,
		StateDir: cfg.stateDir,
		Logger:   logger.With("component", "drift"),
	})
	if err != nil {
		return err
	}
	driftCtx, stopDrift := context.WithCancel(ctx)
	var driftDone sync.WaitGroup
	driftDone.Go(func() { checker.Run(driftCtx) })
	defer driftDone.Wait() // before the store closes its sources
	defer stopDrift()

	healthSrv := health.NewServer()
	statsSrv := grpc.NewServer(server.UnaryInterceptors(logger.With("component", "stats")))
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(statsSrv, server.NewStatsService(store, nil, logger.With("component", "stats")).WithDrift(checker))
	healthpb.RegisterHealthServer(statsSrv, healthSrv)
	reflection.Register(statsSrv)

	lifeSrv := grpc.NewServer(server.UnaryInterceptors(logger.With("component", "lifecycle")))
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(lifeSrv, server.NewLifecycleService(store, logger.With("component", "lifecycle")))
	healthpb.RegisterHealthServer(lifeSrv, healthSrv)
	reflection.Register(lifeSrv)

	errc := make(chan error, 2)
	go func() { errc <- statsSrv.Serve(statsLis) }()
	go func() { errc <- lifeSrv.Serve(lifeLis) }()
	for _, svc := range []string{"", sandboxstatsv1.WorkloadStatsService_ServiceDesc.ServiceName, sandboxstatsv1.WorkloadLifecycleService_ServiceDesc.ServiceName} {
		healthSrv.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	logger.Info("statsd serving", "listen", cfg.listen, "lifecycle_listen", cfg.lifecycleListen, "state_dir", cfg.stateDir, "drift_interval", cfg.driftInterval)

	var serveErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-errc:
		logger.Error("server stopped", "err", serveErr)
	}
	healthSrv.Shutdown() // NOT_SERVING for anyone still polling
	hardStop := time.AfterFunc(cfg.shutdownTimeout, func() {
		logger.Warn("graceful shutdown timed out; stopping hard")
		statsSrv.Stop()
		lifeSrv.Stop()
	})
	defer hardStop.Stop()
	lifeSrv.GracefulStop()
	statsSrv.GracefulStop()
	return serveErr
}

// opener builds the measurement sources for a ref from the configured roots.
func opener(cfg config, logger *slog.Logger) identity.Opener {
	return func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
		host, herr := hoststat.Open(ref, hoststat.Config{
			ProcRoot: cfg.procRoot, DebugfsRoot: cfg.debugfsRoot, ReadTimeout: cfg.readTimeout,
			Logger: logger.With("component", "hoststat"), SandboxProcesses: gvisor.SandboxProcesses,
		})
		if herr != nil {
			logger.Warn("host views unavailable", "err", herr)
		}
		var (
			src source.Source
			err error
		)
		switch ref.Class {
		case source.ClassGVisor:
			src, err = gvisor.Open(ref, gvisor.Config{
				CgroupRoot: cfg.cgroupRoot, ProcRoot: cfg.procRoot, ReadTimeout: cfg.readTimeout,
				Logger: logger.With("component", "gvisor"),
			})
		case source.ClassMicroVM:
			src, err = microvm.Open(ref, microvm.Config{
				CallTimeout: cfg.readTimeout, Logger: logger.With("component", "microvm"),
			})
		default:
			err = fmt.Errorf("unknown sandbox class %v", ref.Class)
		}
		return src, host, err
	}
}

// listenUnix listens on a Unix socket at path with the given mode, creating
// its directory with dirMode if missing. A stale socket file (connection
// refused: nobody listens) is replaced; any other answer means it may be live
// and is an error. The returned cleanup removes the file only if it is still
// the one this process created.
func listenUnix(path string, dirMode, mode os.FileMode) (net.Listener, func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, nil, fmt.Errorf("listen %s: another process is serving on it", path)
		case !errors.Is(err, syscall.ECONNREFUSED):
			return nil, nil, fmt.Errorf("listen %s: cannot tell whether the socket is live, leaving it: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	// The socket is created with 0777 minus the umask and narrowed by Chmod
	// below; a restrictive umask closes that window.
	old := syscall.Umask(0o077)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false) // removed below, only if still ours
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("listen %s: chmod: %w", path, err)
	}
	created, err := os.Lstat(path)
	if err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	cleanup := func() {
		lis.Close()
		// Same inode and same change time: inode numbers are reused, so a
		// socket made later by someone else can share ours.
		if now, err := os.Lstat(path); err == nil && os.SameFile(now, created) && now.ModTime().Equal(created.ModTime()) {
			os.Remove(path)
		}
	}
	return lis, cleanup, nil
}

// Command statsd is the per-sandbox stats daemon. The launcher tells it, on
// its lifecycle socket, which workload runs in the sandbox and where to
// measure it; pollers read that workload's memory and CPU on its stats socket.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sandboxstats/sandboxstats/internal/cli"
	"github.com/sandboxstats/sandboxstats/internal/connlimit"
	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/exepages"
	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/lifecyclewire"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	_ "github.com/sandboxstats/sandboxstats/internal/oneproc" // one Go processor (its doc)
	"github.com/sandboxstats/sandboxstats/internal/peercred"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(exitStatus(err, os.Stdout, os.Stderr))
}

// exitStatus prints what run's err asks for and returns the exit status
// (cli.ExitStatus).
func exitStatus(err error, stdout, stderr io.Writer) int {
	return cli.ExitStatus("statsd", err, stdout, stderr)
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, stderr)
}

// serve is statsd with cfg until ctx is done.
func serve(ctx context.Context, cfg config, stderr io.Writer) error {
	logger := newLogger(stderr, cfg.logLevel)
	quietContainerdLog(logger)
	rctx, stopRelease := context.WithCancel(ctx)
	defer stopRelease()
	go exepages.ReleaseAfter(rctx, exepages.DefaultProcRoot, exepages.DefaultDelay, logger) // docs/design.md, "Memory"
	if cfg.memoryLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.memoryLimit)
	}

	store, err := identity.NewStore(identity.Config{
		StateDir:       cfg.stateDir,
		Open:           opener(cfg, logger),
		Logger:         logger.With("component", "identity"),
		ReadTimeout:    cfg.readTimeout,
		EndedRetention: cfg.endedRetention,
		EndedMax:       cfg.endedMax,
		MaxWorkloads:   cfg.maxWorkloads,
	})
	if err != nil {
		return err
	}
	defer store.Close()

	statsLis, lifeLis, cleanup, err := listeners(cfg, logger)
	if err != nil {
		return err
	}
	defer cleanup()

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

	rel := newReleaser(cfg.releaseAfter, nil, nil)
	defer rel.stop()
	healthSrv := health.NewServer()
	stats := server.NewStatsService(store, nil, logger.With("component", "stats")).WithDrift(checker).WithMaxReads(cfg.maxReads)
	opts := append(append(serverOptions(), rel.options()...), server.UnaryInterceptors(logger.With("component", "stats")))
	statsSrv := grpc.NewServer(append(opts, stats.ServerOptions()...)...)
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(statsSrv, stats)
	healthpb.RegisterHealthServer(statsSrv, healthSrv)
	reflection.Register(statsSrv)

	// The lifecycle codec reads a bind and writes its epoch without protobuf-go's
	// descriptors of the whole API (internal/lifecyclewire).
	lifeSrv := grpc.NewServer(append(append(serverOptions(), rel.options()...), server.UnaryInterceptors(logger.With("component", "lifecycle")), grpc.ForceServerCodecV2(lifecyclewire.Codec{}))...)
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(lifeSrv, server.NewLifecycleService(store, logger.With("component", "lifecycle")).WithDrift(checker))
	healthpb.RegisterHealthServer(lifeSrv, healthSrv)
	reflection.Register(lifeSrv)

	errc := make(chan error, 2)
	go func() { errc <- statsSrv.Serve(statsLis) }()
	go func() { errc <- lifeSrv.Serve(lifeLis) }()
	for _, svc := range []string{"", sandboxstatsv1.WorkloadStatsService_ServiceDesc.ServiceName, sandboxstatsv1.WorkloadLifecycleService_ServiceDesc.ServiceName} {
		healthSrv.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	logger.Info("statsd serving", "listen", cfg.listen, "lifecycle_listen", cfg.lifecycleListen, "state_dir", cfg.stateDir, "drift_interval", cfg.driftInterval)
	stopCounters := logCountersOnSignal(logger, statsLis, lifeLis)
	defer stopCounters()

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
	logger.Info("connections refused while serving", "read_peers_refused", statsLis.peers.Refused(),
		"lifecycle_peers_refused", lifeLis.peers.Refused(), "read_over_cap", statsLis.cap.Refused())
	return serveErr
}

// logCountersOnSignal logs statsd's counters on every SIGUSR1, after
// collections that empty the pools and return free memory to the system (so
// that what stays resident is what is in use): goroutines, heap in use, the peers refused on each
// socket, the read connections refused over the cap and those open now.
// The returned func stops it.
func logCountersOnSignal(logger *slog.Logger, stats, life *guardedListener) func() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-sig:
			}
			// Two collections empty the sync.Pools (gRPC's buffer pools
			// among them: a pool keeps its items through one), then the
			// free memory goes back to the system.
			runtime.GC()
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			logger.Info("statsd counters", "goroutines", runtime.NumGoroutine(), "heap_inuse_bytes", ms.HeapInuse,
				"read_peers_refused", stats.peers.Refused(), "lifecycle_peers_refused", life.peers.Refused(),
				"read_over_cap", stats.cap.Refused(), "read_connections_open", stats.cap.Open())
		}
	}()
	return func() { signal.Stop(sig); close(done) }
}

// guardedListener is a socket with its peer check (and, for the read
// socket, its connection cap).
type guardedListener struct {
	net.Listener
	peers *peercred.Listener
	cap   *connlimit.Listener // nil on the lifecycle socket
}

// listeners makes both sockets: the read socket (mode 0660, --socket-group,
// peers by --read-allow-uids/gids, at most the connection cap served at
// once) and the lifecycle socket (mode 0600, peers by
// --lifecycle-allow-uids). The cleanup closes both and removes their files.
func listeners(cfg config, logger *slog.Logger) (stats, life *guardedListener, cleanup func(), err error) {
	gid := -1
	if cfg.socketGroup != "" {
		if gid, err = lookupGroup(cfg.socketGroup); err != nil {
			return nil, nil, nil, err
		}
	}
	statsUL, removeStats, err := listenUnix(cfg.listen, 0o755, 0o660, gid)
	if err != nil {
		return nil, nil, nil, err
	}
	lifeUL, removeLife, err := listenUnix(cfg.lifecycleListen, 0o700, 0o600, -1)
	if err != nil {
		removeStats()
		return nil, nil, nil, err
	}
	cleanup = func() { removeLife(); removeStats() }
	readGIDs := cfg.readGIDs
	if !cfg.readGIDsSet {
		g, err := socketGID(cfg.listen)
		if err != nil {
			cleanup()
			return nil, nil, nil, fmt.Errorf("listen %s: %w", cfg.listen, err)
		}
		readGIDs = []uint32{g}
	}
	readPolicy := peercred.Policy{UIDs: cfg.readUIDs, GIDs: readGIDs}
	lifePolicy := peercred.Policy{UIDs: cfg.lifecycleUIDs}
	max, nofile := connCap(cfg.maxReadConns)
	log := logger.With("component", "listen")
	statsPeers := peercred.Listen(statsUL, peercred.Config{Policy: readPolicy, ProcRoot: cfg.procRoot, Logger: log, Name: "read"})
	stats = &guardedListener{peers: statsPeers, cap: newCapListener(statsPeers, max, log)}
	stats.Listener = stats.cap
	lifePeers := peercred.Listen(lifeUL, peercred.Config{Policy: lifePolicy, ProcRoot: cfg.procRoot, Logger: log, Name: "lifecycle"})
	life = &guardedListener{Listener: lifePeers, peers: lifePeers}
	log.Info("sockets guarded", "read_admits", readPolicy.String(), "lifecycle_admits", lifePolicy.String(),
		"max_read_connections", max, "rlimit_nofile", nofile)
	return stats, life, cleanup, nil
}

// opener builds the measurement sources for a ref from the configured roots.
func opener(cfg config, logger *slog.Logger) identity.Opener {
	return func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
		minInterval := cfg.hostMinInterval
		if minInterval <= 0 {
			minInterval = -1 // hoststat: negative turns the cache off
		}
		host, herr := hoststat.Open(ref, hoststat.Config{
			ProcRoot: cfg.procRoot, DebugfsRoot: cfg.debugfsRoot, ReadTimeout: cfg.readTimeout, MinInterval: minInterval,
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
				RunscRoots: cfg.runscRoots, SentryKeepFor: cfg.sentryKeepFor, Logger: logger.With("component", "gvisor"),
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

package main

// This file is statsd's command line: flags into a config.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/cli"
	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/peercred"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
)

type config struct {
	listen          string
	lifecycleListen string
	stateDir        string
	procRoot        string
	cgroupRoot      string
	debugfsRoot     string
	runscRoots      []string      // --runsc-root, repeatable; none: no per-container breakdown of gVisor sandboxes
	sentryKeepFor   time.Duration // no flag: gvisor.Config.SentryKeepFor (0: its default); the bench's dial-per-read row sets it
	readTimeout     time.Duration
	shutdownTimeout time.Duration
	driftInterval   time.Duration
	driftGrace      time.Duration
	endedRetention  time.Duration
	endedMax        int
	maxWorkloads    int
	hostMinInterval time.Duration
	memoryLimit     int64
	releaseAfter    time.Duration
	logLevel        slog.Level

	// Who is served (SO_PEERCRED), and the read socket's group.
	lifecycleUIDs      []uint32
	readUIDs, readGIDs []uint32
	readGIDsSet        bool   // --read-allow-gids given: else the socket's group
	socketGroup        string // "" keeps the group the socket is created with
	maxReadConns       int
	maxReads           int
}

// idsFlag is a comma-separated list of numeric ids (uids or gids). String
// is the list given, "" before one is: a default that depends on who runs
// statsd is set after parsing and stated in the flag's usage.
type idsFlag struct {
	ids *[]uint32
	set *bool
}

func (f idsFlag) String() string {
	if f.ids == nil {
		return ""
	}
	s := make([]string, len(*f.ids))
	for i, id := range *f.ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ",")
}

func (f idsFlag) Set(s string) error {
	ids, err := peercred.ParseIDs(s)
	if err != nil {
		return err
	}
	*f.ids = ids
	if f.set != nil {
		*f.set = true
	}
	return nil
}

// maxRunscRoots bounds --runsc-root: each is listed at every sample of a
// gVisor sandbox whose id is not known yet.
const maxRunscRoots = 8

// rootsFlag is a repeatable flag of absolute directories.
type rootsFlag struct{ dirs *[]string }

func (f rootsFlag) String() string {
	if f.dirs == nil {
		return ""
	}
	return strings.Join(*f.dirs, ",")
}

func (f rootsFlag) Set(s string) error {
	if s == "" || !filepath.IsAbs(s) {
		return fmt.Errorf("%q is not an absolute directory", s)
	}
	if len(*f.dirs) == maxRunscRoots {
		return fmt.Errorf("at most %d runsc roots", maxRunscRoots)
	}
	*f.dirs = append(*f.dirs, filepath.Clean(s))
	return nil
}

const exitStatusHelp = `
Exit status: 0 after a clean shutdown (SIGINT, SIGTERM), --help or --version;
1 when serving failed; 2 for a usage error (unknown flag, bad value).
`

// parseFlags parses the command line; every error it returns is a
// cli.UsageError, flag.ErrHelp or cli.ErrVersion.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	c, err := parseFlagsOnly(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, cli.ErrVersion) {
		return c, cli.UsageError{Err: err}
	}
	return c, err
}

func parseFlagsOnly(args []string, stderr io.Writer) (config, error) {
	c := config{listen: "/run/statsd/statsd.sock", lifecycleListen: "/run/statsd/lifecycle/statsd.sock"}
	var showVersion, lifecycleUIDsSet, readUIDsSet bool
	fs := flag.NewFlagSet("statsd", flag.ContinueOnError)
	// The flag package would print a usage error and the whole usage; main
	// prints the error once, and --help prints the usage below.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.Var(sockaddr.Flag{Path: &c.listen}, "listen", "Unix socket for the read-only stats service (mode 0660): a `path`, unix:PATH or unix:///PATH")
	fs.Var(sockaddr.Flag{Path: &c.lifecycleListen}, "lifecycle-listen", "Unix socket for the launcher's lifecycle service (mode 0600): a `path`, unix:PATH or unix:///PATH; kept out of the stats sockets' directory so a node agent's glob never matches it")
	fs.StringVar(&c.stateDir, "state-dir", "/var/lib/statsd", "directory holding the bound workload across restarts")
	fs.StringVar(&c.procRoot, "proc-root", "/proc", "mount point of procfs")
	fs.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "mount point of the cgroup file system(s)")
	fs.StringVar(&c.debugfsRoot, "debugfs-root", "/sys/kernel/debug", "mount point of debugfs (KVM counters)")
	fs.Var(rootsFlag{dirs: &c.runscRoots}, "runsc-root", "runsc root `dir`ectory (runsc --root; under containerd's runsc shim /run/containerd/runsc/k8s.io), repeatable: its state files name each gVisor sandbox's containers, and each container's CPU is read from the sentry's control server (one containerManager.Event call a sample, bounded by 500ms and --read-timeout). None (the default): no per-container breakdown")
	fs.DurationVar(&c.readTimeout, "read-timeout", 2*time.Second, "bound of every read (file, agent call, pid file)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long graceful shutdown may take before a hard stop")
	fs.DurationVar(&c.driftInterval, "drift-interval", 5*time.Minute, "how often to check that the bound sandbox still matches what runs; 0 turns the check off")
	fs.DurationVar(&c.driftGrace, "drift-grace", 15*time.Minute, "after a Run/Restore, how long before the drift check looks (also how long an agent may stay silent)")
	fs.DurationVar(&c.endedRetention, "ended-retention", identity.DefaultEndedRetention, "how long an ended activation's record (its final sample) is kept for pollers")
	fs.IntVar(&c.endedMax, "ended-max", identity.DefaultEndedMax, "most ended-activation records kept (the oldest go first)")
	fs.IntVar(&c.maxWorkloads, "max-workloads", identity.DefaultMaxWorkloads,
		fmt.Sprintf("most workloads (actors) bound at once; one more is RESOURCE_EXHAUSTED TOO_MANY_WORKLOADS (1 to %d)", identity.LimitMaxWorkloads))
	fs.DurationVar(&c.hostMinInterval, "host-min-interval", hoststat.DefaultMinInterval, "a host view (StatsHost, include_host) is sampled at most once per this interval and served to every reader meanwhile; 0 samples on every read")
	fs.Var(idsFlag{ids: &c.lifecycleUIDs, set: &lifecycleUIDsSet}, "lifecycle-allow-uids", "comma-separated `uids` served on the lifecycle socket (checked with SO_PEERCRED, whatever the socket's mode); default: statsd's own euid")
	fs.Var(idsFlag{ids: &c.readUIDs, set: &readUIDsSet}, "read-allow-uids", "comma-separated `uids` served on the read socket (SO_PEERCRED); default: root and statsd's own euid")
	fs.Var(idsFlag{ids: &c.readGIDs, set: &c.readGIDsSet}, "read-allow-gids", "comma-separated `gids` (primary or supplementary) served on the read socket; default: the read socket's group")
	fs.StringVar(&c.socketGroup, "socket-group", "", "group (name or gid) of the read socket; default: the group it is created with")
	fs.IntVar(&c.maxReadConns, "max-read-connections", 128, "most connections served at once on the read socket (lowered to keep a quarter of RLIMIT_NOFILE, at least 64 descriptors, for the lifecycle socket and state files); more are closed on accept")
	fs.IntVar(&c.maxReads, "max-reads", server.DefaultMaxReads, "most reads (StatsWorkload, StatsActiveWorkloads, StatsHost, ListEndedActivations) served at once across every read connection; one more is RESOURCE_EXHAUSTED TOO_MANY_READS at once. Discovery reads asked while one is being read share its answer")
	fs.Int64Var(&c.memoryLimit, "memory-limit", 48<<20, "soft limit of the Go heap in bytes (runtime/debug.SetMemoryLimit; GOMEMLIMIT, if set, wins); the collector works harder near it; 0 sets none")
	fs.DurationVar(&c.releaseAfter, "release-after", 5*time.Second, "once no RPC has come for this long (and the heap was collected since the last time), return the free heap to the system (runtime/debug.FreeOSMemory); 0 never does")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	fs.BoolVar(&showVersion, "version", false, "print the version (module, VCS revision and time, Go) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: statsd [flags]\n\nServes one sandbox's workload stats over gRPC on Unix sockets.\n\nFlags:\n")
			fs.PrintDefaults()
			fmt.Fprint(stderr, exitStatusHelp)
		}
		return c, err
	}
	if showVersion {
		return c, cli.ErrVersion
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
	if c.maxWorkloads < 1 || c.maxWorkloads > identity.LimitMaxWorkloads {
		return c, fmt.Errorf("--max-workloads must be 1 to %d, not %d", identity.LimitMaxWorkloads, c.maxWorkloads)
	}
	if c.listen == c.lifecycleListen {
		return c, errors.New("--listen and --lifecycle-listen must differ")
	}
	me := uint32(os.Geteuid())
	if !lifecycleUIDsSet {
		c.lifecycleUIDs = []uint32{me}
	}
	if !readUIDsSet {
		c.readUIDs = []uint32{0}
		if me != 0 {
			c.readUIDs = append(c.readUIDs, me)
		}
	}
	if len(c.lifecycleUIDs) == 0 {
		return c, errors.New("--lifecycle-allow-uids must name at least one uid")
	}
	if c.maxReadConns <= 0 {
		return c, errors.New("--max-read-connections must be positive")
	}
	if c.maxReads <= 0 {
		return c, errors.New("--max-reads must be positive")
	}
	if c.releaseAfter < 0 {
		return c, errors.New("--release-after must not be negative")
	}
	return c, nil
}

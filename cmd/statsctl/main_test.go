package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/server"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// scriptedSource answers every Sample with one reading or error.
// scriptedSource answers a settable reading or error. Safe for concurrent
// use: the store's baseline taker reads a guest's source in the background.
type scriptedSource struct {
	mu      sync.Mutex
	reading source.Reading
	err     error
}

func (s *scriptedSource) Sample(context.Context) (source.Reading, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reading, s.err
}

// set makes r and err the answer of every later Sample.
func (s *scriptedSource) set(r source.Reading, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reading, s.err = r, err
}
func (s *scriptedSource) Close() error { return nil }

var (
	peak  = uint64(224_350_208)
	procs = uint32(5)
	zero  = uint32(0)
)

type daemon struct {
	stats, lifecycle string
	src              *scriptedSource
	store            *identity.Store
	checker          *drift.Checker
	clock            time.Time
	host             *scriptedHost
	seq              *sequenceSource
	tick             time.Duration // how far the stats clock moves per read
	reads            atomic.Int64
}

// scriptedHost answers SampleHost with its samples in turn.
type scriptedHost struct {
	samples []*source.HostStats
	n       atomic.Int64
}

func (h *scriptedHost) SampleHost(context.Context) (*source.HostStats, error) {
	i := int(h.n.Add(1)) - 1
	return h.samples[min(i, len(h.samples)-1)], nil
}
func (h *scriptedHost) Close() error { return nil }

// sequenceSource answers Sample with its readings in turn; before reading
// number bindAt it re-binds the workload (a restore under the read).
type sequenceSource struct {
	readings []source.Reading
	n        atomic.Int64
	onRead   func(n int)
}

func (s *sequenceSource) Sample(context.Context) (source.Reading, error) {
	i := int(s.n.Add(1)) - 1
	if s.onRead != nil {
		s.onRead(i)
	}
	return s.readings[min(i, len(s.readings)-1)], nil
}
func (s *sequenceSource) Close() error { return nil }

// startDaemon serves statsd's services on Unix sockets with a fixed clock, so
// outputs are byte-for-byte stable.
func startDaemon(t *testing.T) *daemon { t.Helper(); return startDaemonAt(t, "") }

// startDaemonAt is startDaemon with the stats socket at stats ("": in a
// temporary directory); each of with changes the store's config.
func startDaemonAt(t *testing.T, stats string, with ...func(*identity.Config)) *daemon {
	t.Helper()
	dir := t.TempDir()
	if stats == "" {
		stats = filepath.Join(dir, "s.sock")
	}
	d := &daemon{stats: stats, lifecycle: filepath.Join(dir, "l.sock"), src: &scriptedSource{}, host: &scriptedHost{}}
	clock := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	d.clock = clock
	cfg := identity.Config{
		Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			if ref.CgroupPath == bootingPath {
				return &scriptedSource{err: fmt.Errorf("gvisor: %s: no such cgroup yet: %w", ref.CgroupPath, source.ErrNotMeasurable)}, nil, nil
			}
			if d.seq != nil {
				return d.seq, d.host, nil
			}
			return d.src, d.host, nil
		},
		Now: func() time.Time { return clock.Add(time.Duration(d.reads.Load()) * time.Second) },
	}
	for _, f := range with {
		f(&cfg)
	}
	store, err := identity.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.store = store
	d.checker, err = drift.New(drift.Config{
		Store: store, Observer: drift.NewSystemObserver(t.TempDir(), time.Second, time.Minute, nil),
		Interval: time.Minute, Now: func() time.Time { return clock.Add(5 * time.Minute) },
	})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	srv := grpc.NewServer(server.UnaryInterceptors(logger))
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, server.NewStatsService(store, func() time.Time {
		return clock.Add(90*time.Second + time.Duration(d.reads.Add(1)-1)*d.tick)
	}, logger).WithDrift(d.checker))
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(srv, server.NewLifecycleService(store, logger).WithDrift(d.checker))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	for _, p := range []string{d.stats, d.lifecycle} {
		lis, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(lis)
	}
	t.Cleanup(srv.Stop)
	return d
}

func (d *daemon) ctl(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	real := make([]string, len(args))
	for i, a := range args {
		real[i] = strings.NewReplacer("$STATS", d.stats, "$LIFECYCLE", d.lifecycle).Replace(a)
	}
	var out, errOut bytes.Buffer
	code = run(context.Background(), real, &out, &errOut)
	// The instance id is random: named, so outputs are stable.
	instance := strings.NewReplacer(d.store.EndedLog().InstanceID, "$INSTANCE")
	return instance.Replace(out.String()), instance.Replace(strings.ReplaceAll(errOut.String(), filepath.Dir(d.stats), "$DIR")), code
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	testenv.Golden(t, name, []byte(got))
}

// bootingPath is a sandbox the golden daemon opens as not measurable yet.
const bootingPath = "/statstest/booting"

func TestGolden(t *testing.T) {
	d := startDaemon(t)
	gv := []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c",
		"--actor-name", "web", "--actor-namespace", "team-a", "--template-namespace", "templates", "--template-name", "python",
		"--class", "gvisor", "--cgroup-path", "/statstest/pod1"}
	v1 := source.Reading{
		Kind: source.KindCgroup, Detail: "cgroup v1 (hybrid): /sys/fs/cgroup/memory/statstest/pod1, /sys/fs/cgroup/cpuacct/statstest/pod1",
		MemoryCurrentBytes: 222_867_456, MemoryPeakBytes: &peak, MemoryWorkingSetBytes: 222_728_192,
		CPUUsageUsec: cpuUsec(255_682), SandboxProcesses: &procs,
	}
	noPeak := v1
	noPeak.Detail = "cgroup v2: /sys/fs/cgroup/statstest/pod1"
	noPeak.MemoryPeakBytes = nil
	noPeak.Absent = []source.Absent{{Field: "memory_peak_bytes", Reason: "memory.peak not offered by this kernel (needs Linux 5.19)"}}
	dead := v1
	dead.SandboxProcesses = &zero
	partial := source.Reading{
		Kind: source.KindGuestAgent, Detail: "guest agent hvsock:///run/vm/clh.sock:1024, agent_version 3.9.0; guest cgroup v2; 1 container(s) summed",
		MemoryCurrentBytes: 100 << 20, MemoryWorkingSetBytes: 90 << 20,
		UnreadContainers: []source.ContainerError{{ID: "sidecar", Reason: source.ReasonUnknownContainer}},
		Absent: []source.Absent{
			{Field: "memory_peak_bytes", Reason: "partial sample: 1 of 2 containers unread; a partial sum is not comparable with a full one"},
			{Field: "cpu_usage_usec", Reason: "partial sample: 1 of 2 containers unread; a partial sum is not comparable with a full one"},
		},
	}

	for _, tc := range []struct {
		name    string
		reading source.Reading
		err     error
		args    []string
		code    int
	}{
		{name: "active-no-workload", args: []string{"active", "--socket", "$STATS"}},
		{name: "stats-no-workload", args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}, code: exitError},
		{name: "run-workload", args: gv},
		{name: "run-workload-other", args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "other", "--class", "gvisor", "--cgroup-path", "/statstest/pod1"}, code: exitError},
		{name: "run-workload-invalid", args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--class", "gvisor", "--cgroup-path", "relative"}, code: exitError},
		{name: "run-workload-pid-out-of-range", args: []string{"run-workload", "--actor-uid", "x", "--class", "gvisor", "--sentry-pid", "4294967297"}, code: exitUsage},
		{name: "run-workload-bad-class", args: []string{"run-workload", "--actor-uid", "x", "--class", "docker"}, code: exitUsage},
		{name: "stats-table", reading: v1, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-json", reading: v1, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "-o", "json"}},
		{name: "stats-no-peak", reading: noPeak, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-dead-sandbox", reading: dead, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-partial-guest", reading: partial, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "active-partial-guest", reading: partial, args: []string{"active", "--socket", "$STATS"}},
		{name: "stats-mismatch", reading: v1, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "someone-else"}, code: exitError},
		{name: "stats-invalid-uid", reading: v1, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "has space"}, code: exitError},
		{name: "stats-not-measurable", err: fmt.Errorf("gvisor: /sys/fs/cgroup/memory/statstest/pod1: no such cgroup: %w", source.ErrNotMeasurable), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}, code: exitError},
		{name: "stats-timeout", err: fmt.Errorf("%w: /sys/fs/cgroup/memory/statstest/pod1/memory.usage_in_bytes: context deadline exceeded", source.ErrTimeout), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}, code: exitError},
		{name: "stats-malformed", err: fmt.Errorf("%w: /sys/fs/cgroup/statstest/pod1/memory.current: token %q is not a number", source.ErrMalformed, "max"), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}, code: exitError},
		{name: "active-table", reading: v1, args: []string{"active", "--socket", "$STATS"}},
		{name: "active-json", reading: v1, args: []string{"active", "--socket", "$STATS", "-o", "json"}},
		{name: "active-not-measurable", err: fmt.Errorf("cgroup not created yet: %w", source.ErrNotMeasurable), args: []string{"active", "--socket", "$STATS"}},
		{name: "health", args: []string{"health", "--socket", "$STATS"}},
		{name: "restore-workload", reading: v1, args: append([]string{"restore-workload"}, gv[1:]...)},
		{name: "checkpoint-other", args: []string{"checkpoint-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "other"}, code: exitError},
		{name: "checkpoint", reading: dead, args: []string{"checkpoint-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c"}},
		{name: "checkpoint-retry", args: []string{"checkpoint-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c"}},
		{name: "activations", args: []string{"activations", "--socket", "$STATS"}},
		{name: "activations-json", args: []string{"activations", "--socket", "$STATS", "-o", "json"}},
		{name: "run-workload-again", reading: v1, args: gv},
		{name: "run-workload-second", reading: v1, args: append(slices.Clone(gv), "--actor-uid", "actor-9a1d", "--cgroup-path", "/statstest/pod2")},
		{name: "run-workload-third", reading: v1, args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-b007", "--class", "gvisor", "--cgroup-path", bootingPath}},
		{name: "run-workload-same-sandbox", args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-c0de", "--class", "gvisor", "--cgroup-path", "/statstest/pod2"}, code: exitError},
		{name: "active-several", reading: v1, args: []string{"active", "--socket", "$STATS"}},
		{name: "stats-several-mismatch", reading: v1, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "someone-else"}, code: exitError},
		{name: "checkpoint-one-of-several", reading: v1, args: []string{"checkpoint-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-9a1d"}},
		{name: "activations-several", args: []string{"activations", "--socket", "$STATS"}},
		{name: "checkpoint-runtime-stopped", reading: dead, args: []string{"checkpoint-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--runtime-stopped"}},
		{name: "stray-argument", args: []string{"active", "--socket", "$STATS", "extra"}, code: exitUsage},
		{name: "unknown-command", args: []string{"frobnicate"}, code: exitUsage},
		{name: "help", args: []string{"--help"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.src.set(tc.reading, tc.err)
			out, errOut, code := d.ctl(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, errOut)
			}
			golden(t, tc.name, "$ statsctl "+strings.Join(tc.args, " ")+"\n"+out+errOut)
		})
	}
}

// goldenCase is one statsctl run against a daemon whose source answers
// reading (or err).
type goldenCase struct {
	name    string
	reading source.Reading
	err     error
	args    []string
	code    int
}

// runGolden runs each case in turn against d, which must have actor-7f3c
// bound.
func runGolden(t *testing.T, d *daemon, cases []goldenCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d.src.set(tc.reading, tc.err)
			out, errOut, code := d.ctl(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, errOut)
			}
			golden(t, tc.name, "$ statsctl "+strings.Join(tc.args, " ")+"\n"+out+errOut)
		})
	}
}

// bindGolden binds actor-7f3c to d as TestGolden does.
func bindGolden(t *testing.T, d *daemon) {
	t.Helper()
	if _, errOut, code := d.ctl(t, "run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c",
		"--actor-name", "web", "--actor-namespace", "team-a", "--template-namespace", "templates", "--template-name", "python",
		"--class", "gvisor", "--cgroup-path", "/statstest/pod1"); code != 0 {
		t.Fatal(errOut)
	}
}

// TestGoldenGuestText: guest text aimed at the terminal (an OSC retitling
// it, a forged line, a C1 CSI) is printed escaped in tables and errors, and
// kept (JSON-escaped) in JSON.
func TestGoldenGuestText(t *testing.T) {
	d := startDaemon(t)
	bindGolden(t, d)
	// A guest agent's text aimed at the terminal: an OSC retitling it, a
	// forged line, a C1 CSI.
	const escapes = "\x1b]0;pwned\x07\nACTOR forged\u009b31m"
	guestEscapes := source.Reading{
		Kind: source.KindGuestAgent, Detail: "guest agent hvsock:///run/vm/clh.sock:1024, agent_version " + escapes,
		MemoryCurrentBytes: 100 << 20, MemoryWorkingSetBytes: 90 << 20,
	}
	guestEscapes.UnreadContainers = []source.ContainerError{{ID: "side" + escapes, Reason: "agent: " + escapes}}
	guestEscapes.Absent = []source.Absent{
		{Field: "memory_peak_bytes", Reason: "partial sample: " + escapes},
		{Field: "cpu_usage_usec", Reason: "partial sample: " + escapes},
	}

	runGolden(t, d, []goldenCase{
		{name: "stats-guest-escapes", reading: guestEscapes, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-guest-escapes-json", reading: guestEscapes, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "-o", "json"}},
		{name: "stats-error-escapes", err: fmt.Errorf("%w: agent StatsContainer: %s", source.ErrMalformed, escapes), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}, code: exitError},
	})
}

func TestGoldenDrift(t *testing.T) {
	d := startDaemon(t)
	if _, _, code := d.ctl(t, "run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--class", "gvisor", "--cgroup-path", "/statstest/pod1"); code != 0 {
		t.Fatal("run-workload failed")
	}
	steps := []struct {
		name  string
		procs uint32
		args  []string
	}{
		{"drift-before-cycle", 3, []string{"drift", "--socket", "$STATS"}},
		{"drift-dead-sandbox", 0, []string{"drift", "--socket", "$STATS"}},
		{"stats-with-drift", 0, []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{"drift-cleared", 3, []string{"drift", "--socket", "$STATS"}},
		{"drift-json", 3, []string{"drift", "--socket", "$STATS", "-o", "json"}},
	}
	for i, st := range steps {
		procs := st.procs
		d.src.set(source.Reading{Kind: source.KindCgroup, Detail: "cgroup v1", MemoryCurrentBytes: 13 << 20, SandboxProcesses: &procs}, nil)
		if i > 0 {
			d.checker.Cycle(context.Background())
		}
		out, errOut, code := d.ctl(t, st.args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", st.name, code, errOut)
		}
		golden(t, st.name, "$ statsctl "+strings.Join(st.args, " ")+"\n"+out+errOut)
	}
}

func TestGoldenWatch(t *testing.T) {
	d := startDaemon(t)
	d.tick = 5 * time.Second
	mib := func(n uint64) uint64 { return n << 20 }
	r := func(cpu, cur uint64) source.Reading {
		return source.Reading{Kind: source.KindCgroup, Detail: "cgroup v1", MemoryCurrentBytes: mib(cur), MemoryWorkingSetBytes: mib(cur) - mib(1), MemoryPeakBytes: &peak, CPUUsageUsec: cpuUsec(cpu)}
	}
	d.seq = &sequenceSource{readings: []source.Reading{
		r(1_000_000, 20), r(3_500_000, 220), r(6_000_000, 220), r(6_100_000, 20), // 0.5 cores, then 0.5, then 0.02
		r(100_000, 20), // restored: the counter starts again in a new epoch
		r(600_000, 20),
	}}
	d.seq.onRead = func(n int) {
		if n == 4 { // a Restore lands under this read: ACTOR_CHANGED, then a new epoch
			if _, _, err := d.store.Bind(context.Background(), identity.OpRestore, identity.Identity{ActorUID: "actor-7f3c"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest/pod1"}); err != nil {
				t.Error(err)
			}
		}
	}
	if _, errOut, code := d.ctl(t, "run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--class", "gvisor", "--cgroup-path", "/statstest/pod1"); code != 0 {
		t.Fatal(errOut)
	}
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			d.seq.n.Store(0)
			args := []string{"watch", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "--interval", "1ms", "--count", "7", "-o", format}
			out, errOut, code := d.ctl(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden(t, "watch-"+format, "$ statsctl "+strings.Join(args, " ")+"\n"+out+errOut)
			// The restore happened at read 4; bind it back to a Run for the next format.
			if _, _, err := d.store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "actor-7f3c"}, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest/pod1"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestGoldenPoll(t *testing.T) {
	// A directory path of fixed length keeps the table's columns stable.
	dir := fmt.Sprintf("/tmp/statsctl-poll-%08x", rand.Uint32())
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The daemons' stats sockets under one glob (a symlink to one would be
	// refused), plus a stale socket whose daemon is gone.
	bound := startDaemonAt(t, filepath.Join(dir, "a-bound.sock"))
	startDaemonAt(t, filepath.Join(dir, "b-idle.sock")) // no workload bound
	stale, err := net.Listen("unix", filepath.Join(dir, "c-gone.sock"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	bound.src.set(source.Reading{Kind: source.KindCgroup, Detail: "cgroup v1", MemoryCurrentBytes: 13 << 20, MemoryWorkingSetBytes: 12 << 20, MemoryPeakBytes: &peak, CPUUsageUsec: cpuUsec(2_500_000)}, nil)
	if _, errOut, code := bound.ctl(t, "run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--template-namespace", "templates", "--template-name", "python", "--class", "gvisor", "--cgroup-path", "/statstest/pod1"); code != 0 {
		t.Fatal(errOut)
	}
	args := []string{"poll", "--sockets", dir + "/*.sock", "--timeout", "2s"}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	got := strings.ReplaceAll(out.String()+errOut.String(), dir, "$DIR")
	golden(t, "poll", "$ statsctl poll --sockets '$DIR/*.sock' --timeout 2s\n"+got)
}

func TestGoldenHost(t *testing.T) {
	d := startDaemon(t)
	at := d.clock.Add(time.Minute)
	view := func(sec int, userUsec, systemUsec, stealUsec uint64) *source.HostStats {
		return &source.HostStats{
			ObservedAtUnixNano: at.Add(time.Duration(sec) * time.Second).UnixNano(),
			GuestName:          "srv1", GuestNameSource: "pid file directory",
			RunnerKernel: &source.RunnerKernelView{
				Legend: "host kernel /proc/stat; user includes guest",
				Total:  &source.CPUTimes{CPU: "cpu", UserUsec: userUsec, SystemUsec: systemUsec, StealUsec: stealUsec},
			},
		}
	}
	d.host.samples = []*source.HostStats{view(0, 1_000_000, 500_000, 10_000), view(10, 6_000_000, 1_500_000, 10_000)}
	if _, errOut, code := d.ctl(t, "run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c", "--class", "microvm",
		"--agent-address", "hvsock:///run/vm/clh.sock:1024", "--container-id", "web", "--vmm-pid-file", "/run/vm/srv1/qemu.pid"); code != 0 {
		t.Fatal(errOut)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"host-sample", []string{"host", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{"host-window", []string{"host", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "--window", "1ms"}},
		{"host-window-json", []string{"host", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "--window", "1ms", "-o", "json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.host.n.Store(0)
			out, errOut, code := d.ctl(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden(t, tc.name, "$ statsctl "+strings.Join(tc.args, " ")+"\n"+out+errOut)
		})
	}
}

// cpuUsec returns a CPU counter value for a source.Reading.
func cpuUsec(v uint64) *uint64 { return &v }

func u64(v uint64) *uint64 { return &v }

// signalsReading is a v1 cgroup reading with every signal and traffic part:
// a 64 MiB limit and one OOM kill, a 20 ms / 100 ms quota that bit, pids,
// a network namespace with one interface and loopback, 64 MiB written.
func signalsReading() source.Reading {
	under := false
	return source.Reading{
		Kind: source.KindCgroup, Detail: "cgroup v1 (hybrid): /sys/fs/cgroup/memory/statstest/pod1",
		MemoryCurrentBytes: 60 << 20, MemoryPeakBytes: u64(64 << 20), MemoryWorkingSetBytes: 59 << 20,
		CPUUsageUsec: cpuUsec(500_000), SandboxProcesses: &procs,
		Memory: &source.MemorySignals{LimitBytes: &source.Limit{Value: 64 << 20}, OOMKills: u64(1), UnderOOM: &under},
		Throttling: &source.CPUThrottling{Periods: u64(25), ThrottledPeriods: u64(25), ThrottledUsec: u64(1_968_978),
			QuotaUsec: &source.Limit{Value: 20_000}, PeriodUsec: u64(100_000)},
		Pids: &source.Pids{Current: 5, Limit: &source.Limit{Value: 512}},
		Network: &source.Network{Layer: source.NetworkLayerHostNamespace, Origin: "/proc/4242/net/dev",
			Total:      &source.InterfaceCounters{Name: "total", RxBytes: 1 << 20, RxPackets: 700, TxBytes: 10 << 20, TxPackets: 7300},
			Interfaces: []source.InterfaceCounters{{Name: "eth0", RxBytes: 1 << 20, RxPackets: 700, TxBytes: 10 << 20, TxPackets: 7300}},
			Loopback:   &source.InterfaceCounters{Name: "lo", RxBytes: 4096, RxPackets: 40, TxBytes: 4096, TxPackets: 40}},
		BlockIO: &source.BlockIO{WriteBytes: 64 << 20, WriteIOs: 128, Devices: []source.DeviceIO{{Major: 254, Minor: 0, WriteBytes: 64 << 20, WriteIOs: 128}},
			Origin: "blkio.throttle.io_service_bytes; counted devices 254:0 (IO to any other device is not counted)"},
		Absent: []source.Absent{
			{Field: "memory_signals.high_bytes", Reason: "cgroup v1 has no memory.high"},
			{Field: "memory_signals.oom_group_kills", Reason: "cgroup v1 has no memory.events"},
			{Field: "pressure", Reason: "no PSI for this cgroup: the sentry is in the unified root (0::/)"},
		},
	}
}

// TestGoldenSignals: statsctl stats and watch with the signal and traffic
// parts: set, unlimited, loopback only, absent with their reasons.
func TestGoldenSignals(t *testing.T) {
	d := startDaemon(t)
	bindGolden(t, d)
	loose := signalsReading()
	loose.Detail = "cgroup v2: /sys/fs/cgroup/statstest/pod1"
	loose.Memory = &source.MemorySignals{LimitBytes: &source.Limit{Unlimited: true}, HighBytes: &source.Limit{Unlimited: true},
		OOMKills: u64(0), OOMGroupKills: u64(0), OOMEvents: u64(0), MaxEvents: u64(0)}
	loose.Throttling = &source.CPUThrottling{Periods: u64(0), ThrottledPeriods: u64(0), ThrottledUsec: u64(0),
		QuotaUsec: &source.Limit{Unlimited: true}, PeriodUsec: u64(100_000)}
	loose.Pressure = &source.Pressure{CPU: &source.PressureStall{SomeUsec: u64(1_609_112)},
		Memory: &source.PressureStall{SomeUsec: u64(0), FullUsec: u64(0)}, IO: &source.PressureStall{SomeUsec: u64(12), FullUsec: u64(10)}}
	loose.Pids = &source.Pids{Current: 1, Limit: &source.Limit{Unlimited: true}}
	loose.Network = &source.Network{Layer: source.NetworkLayerHostNamespace, Origin: "/proc/4242/net/dev", LoopbackOnly: true,
		Loopback: &source.InterfaceCounters{Name: "lo"}}
	loose.BlockIO = nil
	loose.Absent = []source.Absent{
		{Field: "pressure.cpu.full_usec", Reason: "cpu.pressure has no full line before Linux 5.13"},
		{Field: "network.total", Reason: "loopback only: no network but loopback"},
		{Field: "block_io", Reason: "io controller not enabled for this cgroup"},
	}
	runGolden(t, d, []goldenCase{
		{name: "stats-signals", reading: signalsReading(), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-signals-json", reading: signalsReading(), args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "-o", "json"}},
		{name: "stats-signals-unlimited", reading: loose, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
	})

	// watch: 5 s apart, a throttled busy loop with CPU pressure, sending
	// 10 MiB/s and writing 64 MiB once.
	d = startDaemon(t)
	d.tick = 5 * time.Second
	step := func(i uint64) source.Reading {
		r := signalsReading()
		r.CPUUsageUsec = cpuUsec(1_000_000 * i)
		r.Throttling.ThrottledUsec = u64(4_000_000 * i)
		r.Throttling.Periods, r.Throttling.ThrottledPeriods = u64(50*i), u64(40*i)
		r.Pressure = &source.Pressure{CPU: &source.PressureStall{SomeUsec: u64(2_500_000 * i)}}
		r.Network.Total.TxBytes, r.Network.Total.RxBytes = 50<<20*i, 1<<20*i
		if i >= 2 {
			r.BlockIO.WriteBytes = 64 << 20
		} else {
			r.BlockIO.WriteBytes = 0
		}
		r.Absent = nil
		return r
	}
	d.seq = &sequenceSource{readings: []source.Reading{step(1), step(2), step(3)}}
	bindGolden(t, d)
	for _, format := range []string{"table", "json"} {
		t.Run("watch-"+format, func(t *testing.T) {
			d.seq.n.Store(0)
			args := []string{"watch", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "--interval", "1ms", "--count", "3", "-o", format}
			out, errOut, code := d.ctl(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden(t, "watch-signals-"+format, "$ statsctl "+strings.Join(args, " ")+"\n"+out+errOut)
		})
	}
}

package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// signals is the part of a Reading TestSampleSignals compares: the signal
// and traffic parts and their absent entries (TestSampleFixtures holds the
// rest).
type signals struct {
	Memory     *source.MemorySignals
	Throttling *source.CPUThrottling
	Pressure   *source.Pressure
	Pids       *source.Pids
	Network    *source.Network
	BlockIO    *source.BlockIO
	Absent     []source.Absent
}

func signalsOf(r source.Reading) signals {
	s := signals{Memory: r.Memory, Throttling: r.Throttling, Pressure: r.Pressure, Pids: r.Pids, Network: r.Network, BlockIO: r.BlockIO}
	for _, a := range r.Absent {
		switch a.Field {
		case "memory_peak_bytes", "cpu_usage_usec", "sandbox_processes":
		default:
			s.Absent = append(s.Absent, a)
		}
	}
	return s
}

func lim(v uint64) *source.Limit { return &source.Limit{Value: v} }

var unlimited = &source.Limit{Unlimited: true}

func bp(v bool) *bool { return &v }

func TestSampleSignals(t *testing.T) {
	const (
		v2Dir   = "testdata/cgroup/v2-signals/sandbox"
		oldDir  = "testdata/cgroup/v2-signals-old/sandbox"
		v1      = "testdata/cgroup/v1-signals"
		v1Old   = "testdata/cgroup/v1-signals-old"
		hybrid  = "testdata/cgroup/hybrid-signals"
		pause   = "/statstest/pause"
		netDev9 = "testdata/proc/900/net/dev"
	)
	noPID := source.Absent{Field: "network", Reason: whyNoPID}
	stall := func(some, full uint64) *source.PressureStall {
		return &source.PressureStall{SomeUsec: u64(some), FullUsec: u64(full)}
	}
	fullPressure := &source.Pressure{CPU: stall(4000, 1000), Memory: stall(2000, 1500), IO: stall(300, 200)}
	v1Memory := &source.MemorySignals{LimitBytes: lim(64 << 20), OOMKills: u64(1), UnderOOM: bp(false)}
	v1Absent := func(extra ...source.Absent) []source.Absent {
		out := []source.Absent{
			{Field: "memory_signals.high_bytes", Reason: "cgroup v1 has no memory.high"},
			{Field: "memory_signals.oom_group_kills", Reason: "cgroup v1 has no memory.events"},
			{Field: "memory_signals.oom_events", Reason: "cgroup v1 has no memory.events"},
			{Field: "memory_signals.max_events", Reason: "cgroup v1 has no memory.events"},
		}
		return append(out, extra...)
	}
	v1Throttling := &source.CPUThrottling{Periods: u64(50), ThrottledPeriods: u64(40), ThrottledUsec: u64(3200000), QuotaUsec: lim(20000), PeriodUsec: u64(100000)}
	v1Block := func(root string) *source.BlockIO {
		return &source.BlockIO{ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 128,
			Devices: []source.DeviceIO{{Major: 254, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 128}},
			Origin: root + "/blkio" + pause + "/blkio.throttle.io_service_bytes, blkio.throttle.io_serviced (blk-throttle counts only devices " +
				"with a throttle rule set since they appeared: 254:0; IO to any other device is not counted)"}
	}
	pureV1Pressure := source.Absent{Field: "pressure", Reason: "a pure cgroup v1 host: the kernel keeps pressure stall information per cgroup only on cgroup v2"}

	for _, tc := range []struct {
		name string
		tree string
		mode Mode
		ref  source.SandboxRef
		want signals
	}{
		{name: "v2, Linux 5.19+, every controller: limit, OOM kill, quota, pressure, pids, io.stat", tree: "v2-signals", mode: ModeUnified,
			ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: signals{
				Memory:     &source.MemorySignals{LimitBytes: lim(64 << 20), HighBytes: unlimited, OOMKills: u64(1), OOMGroupKills: u64(0), OOMEvents: u64(1), MaxEvents: u64(12)},
				Throttling: &source.CPUThrottling{Periods: u64(50), ThrottledPeriods: u64(40), ThrottledUsec: u64(3200000), QuotaUsec: lim(20000), PeriodUsec: u64(100000)},
				Pressure:   fullPressure,
				Pids:       &source.Pids{Current: 7, Limit: unlimited},
				BlockIO: &source.BlockIO{ReadBytes: 5120, WriteBytes: 64 << 20, ReadIOs: 3, WriteIOs: 128, Origin: v2Dir + "/io.stat",
					Devices: []source.DeviceIO{{Major: 254, ReadBytes: 4096, WriteBytes: 64 << 20, ReadIOs: 1, WriteIOs: 128}, {Major: 7, ReadBytes: 1024, ReadIOs: 2}}},
				Absent: []source.Absent{{Field: "memory_signals.under_oom", Reason: "cgroup v2 has no under_oom (a v1 memory.oom_control field)"}, noPID},
			}},
		{name: "v2, older kernel, cpu/io/pids controllers off: oom_group_kill, cpu full, quota, io and pids absent", tree: "v2-signals-old", mode: ModeUnified,
			ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: signals{
				Memory:   &source.MemorySignals{LimitBytes: unlimited, HighBytes: unlimited, OOMKills: u64(0), OOMEvents: u64(0), MaxEvents: u64(0)},
				Pressure: &source.Pressure{CPU: &source.PressureStall{SomeUsec: u64(4000)}, Memory: stall(2000, 1500), IO: stall(300, 200)},
				Absent: []source.Absent{
					{Field: "memory_signals.oom_group_kills", Reason: oldDir + "/memory.events has no oom_group_kill (Linux < 5.19)"},
					{Field: "memory_signals.under_oom", Reason: "cgroup v2 has no under_oom (a v1 memory.oom_control field)"},
					{Field: "cpu_throttling", Reason: oldDir + "/cpu.stat has no nr_periods (the cpu controller is not enabled for this cgroup); " +
						oldDir + "/cpu.stat has no nr_throttled (the cpu controller is not enabled for this cgroup); " +
						oldDir + "/cpu.stat has no throttled_usec (the cpu controller is not enabled for this cgroup); " +
						"no " + oldDir + "/cpu.max (the cpu controller is not enabled for this cgroup)"},
					{Field: "pressure.cpu.full_usec", Reason: `no "full" line in ` + oldDir + "/cpu.pressure (cpu full needs Linux 5.13)"},
					{Field: "pids", Reason: "no " + oldDir + "/pids.current"},
					{Field: "block_io", Reason: "no " + oldDir + "/io.stat (the io controller is not enabled for this cgroup)"},
					noPID,
				},
			}},
		{name: "v1 legacy by path: limit, oom_kill, cfs quota in ns, pids, blkio on an accounted device", tree: "v1-signals", mode: ModeLegacy,
			ref: source.SandboxRef{CgroupPath: pause},
			want: signals{Memory: v1Memory, Throttling: v1Throttling, Pids: &source.Pids{Current: 7, Limit: unlimited}, BlockIO: v1Block(v1),
				Absent: v1Absent(pureV1Pressure, noPID)}},
		{name: "v1 legacy, old kernel, no limits: unlimited page-rounded limit, no oom_kill, quota -1, no device accounted", tree: "v1-signals-old", mode: ModeLegacy,
			ref: source.SandboxRef{CgroupPath: pause},
			want: signals{
				Memory:     &source.MemorySignals{LimitBytes: unlimited, UnderOOM: bp(false)},
				Throttling: &source.CPUThrottling{Periods: u64(0), ThrottledPeriods: u64(0), ThrottledUsec: u64(0), QuotaUsec: unlimited, PeriodUsec: u64(100000)},
				Pids:       &source.Pids{Current: 3, Limit: unlimited},
				Absent: []source.Absent{
					{Field: "memory_signals.high_bytes", Reason: "cgroup v1 has no memory.high"},
					{Field: "memory_signals.oom_kills", Reason: v1Old + "/memory" + pause + "/memory.oom_control has no oom_kill (Linux < 4.13)"},
					{Field: "memory_signals.oom_group_kills", Reason: "cgroup v1 has no memory.events"},
					{Field: "memory_signals.oom_events", Reason: "cgroup v1 has no memory.events"},
					{Field: "memory_signals.max_events", Reason: "cgroup v1 has no memory.events"},
					pureV1Pressure,
					{Field: "block_io", Reason: strings.Replace(whyUncounted, "%s", v1Old+"/blkio/blkio.throttle.io_service_bytes", 1)},
					noPID,
				},
			}},
		{name: "hybrid by sentry pid: every controller's own line, pressure from the unified cgroup, a veth", tree: "hybrid-signals", mode: ModeHybrid,
			ref: source.SandboxRef{SentryPID: 900},
			want: signals{Memory: v1Memory, Throttling: v1Throttling, Pressure: fullPressure, Pids: &source.Pids{Current: 7, Limit: unlimited}, BlockIO: v1Block(hybrid),
				Network: &source.Network{Layer: source.NetworkLayerHostNamespace, Origin: netDev9,
					Total: &source.InterfaceCounters{Name: "total", RxBytes: 55321, RxPackets: 410, RxErrors: 1, TxBytes: 10737384, TxPackets: 7020, TxDropped: 1},
					Interfaces: []source.InterfaceCounters{
						{Name: "sbsveth0a12345", RxBytes: 54321, RxPackets: 400, TxBytes: 10735384, TxPackets: 7000, TxDropped: 1},
						{Name: "eth1", RxBytes: 1000, RxPackets: 10, RxErrors: 1, TxBytes: 2000, TxPackets: 20},
					},
					Loopback: &source.InterfaceCounters{Name: "lo", RxBytes: 120, RxPackets: 2, TxBytes: 120, TxPackets: 2}},
				Absent: v1Absent()}},
		{name: "hybrid by sentry pid as runsc leaves it: 0::/, pids and blkio at the root, --network=none", tree: "hybrid-signals", mode: ModeHybrid,
			ref: source.SandboxRef{SentryPID: 901},
			want: signals{Memory: v1Memory, Throttling: v1Throttling,
				Network: &source.Network{Layer: source.NetworkLayerHostNamespace, Origin: "testdata/proc/901/net/dev", LoopbackOnly: true,
					Loopback: &source.InterfaceCounters{Name: "lo"}},
				Absent: v1Absent(
					source.Absent{Field: "pressure", Reason: "the sentry is in the root of the unified (v2) hierarchy (runsc puts a sandbox in no v2 cgroup on a hybrid host): its pressure would be the whole host's"},
					source.Absent{Field: "pids", Reason: "the sentry's pids cgroup is the root of that hierarchy: its numbers would be the whole host's"},
					source.Absent{Field: "block_io", Reason: "the sentry's blkio cgroup is the root of that hierarchy: its numbers would be the whole host's"},
					source.Absent{Field: "network.total", Reason: "the sandbox's network namespace has no interface but loopback (runsc --network=none): no network, not a zero one"},
				)}},
		{name: "hybrid by path: pressure at the same path in the unified hierarchy", tree: "hybrid-signals", mode: ModeHybrid,
			ref: source.SandboxRef{CgroupPath: pause},
			want: signals{Memory: v1Memory, Throttling: v1Throttling, Pressure: fullPressure, Pids: &source.Pids{Current: 7, Limit: unlimited}, BlockIO: v1Block(hybrid),
				Absent: v1Absent(noPID)}},
		{name: "v1 hierarchies missing: their signals absent, the sample still read", tree: "v1", mode: ModeLegacy,
			ref: source.SandboxRef{CgroupPath: pause},
			want: signals{Absent: []source.Absent{
				{Field: "memory_signals", Reason: "no testdata/cgroup/v1/memory/statstest/pause/memory.limit_in_bytes; cgroup v1 has no memory.high; " +
					"no testdata/cgroup/v1/memory/statstest/pause/memory.oom_control; cgroup v1 has no memory.events"},
				{Field: "cpu_throttling", Reason: "no cpu hierarchy: open testdata/cgroup/v1/cpu: no such file or directory"},
				pureV1Pressure,
				{Field: "pids", Reason: "no pids hierarchy: open testdata/cgroup/v1/pids: no such file or directory"},
				{Field: "block_io", Reason: "no blkio hierarchy: open testdata/cgroup/v1/blkio: no such file or directory"},
				noPID,
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fixture(t, tc.tree, tc.mode, tc.ref).Sample(context.Background())
			if err != nil {
				t.Fatalf("Sample() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, signalsOf(got)); diff != "" {
				t.Errorf("Sample() signals mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSampleSignalsMalformed: a malformed signal file fails the sample with
// ErrMalformed naming the path and the token, like a malformed memory file;
// "max" is a limit only in the files where the kernel writes it.
func TestSampleSignalsMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, tree, file, content, errHas string
		mode                              Mode
		ref                               source.SandboxRef
	}{
		{name: "memory.max not a number", tree: "v2-signals", file: "sandbox/memory.max", content: "64M\n", errHas: `memory.max: token "64M"`},
		{name: "memory.high negative", tree: "v2-signals", file: "sandbox/memory.high", content: "-1\n", errHas: `memory.high: token "-1"`},
		{name: "memory.events bad line", tree: "v2-signals", file: "sandbox/memory.events", content: "oom_kill one\n", errHas: `memory.events: line 1 "oom_kill one": token "one"`},
		{name: "cpu.max one field", tree: "v2-signals", file: "sandbox/cpu.max", content: "20000\n", errHas: "cpu.max: \"20000\": want"},
		{name: "io.pressure bad total", tree: "v2-signals", file: "sandbox/io.pressure", content: "some avg10=0.00 avg60=0.00 avg300=0.00 total=x\n", errHas: `io.pressure: line 1`},
		{name: "pids.current max", tree: "v2-signals", file: "sandbox/pids.current", content: "max\n", errHas: `pids.current: token "max"`},
		{name: "io.stat bad counter", tree: "v2-signals", file: "sandbox/io.stat", content: "8:0 wbytes=-1\n", errHas: `io.stat: line 1 "8:0 wbytes=-1": token "wbytes=-1"`},
		{name: "v1 limit max", tree: "v1-signals", mode: ModeLegacy, file: "memory/statstest/pause/memory.limit_in_bytes", content: "max\n", errHas: `memory.limit_in_bytes: token "max"`},
		{name: "v1 under_oom 2", tree: "v1-signals", mode: ModeLegacy, file: "memory/statstest/pause/memory.oom_control", content: "oom_kill_disable 0\nunder_oom 2\noom_kill 0\n", errHas: "under_oom 2: want 0 or 1"},
		{name: "v1 cfs quota max", tree: "v1-signals", mode: ModeLegacy, file: "cpu/statstest/pause/cpu.cfs_quota_us", content: "max\n", errHas: `cpu.cfs_quota_us: token "max"`},
		{name: "v1 pids.max negative", tree: "v1-signals", mode: ModeLegacy, file: "pids/statstest/pause/pids.max", content: "-1\n", errHas: `pids.max: token "-1"`},
		{name: "v1 blkio no Total", tree: "v1-signals", mode: ModeLegacy, file: "blkio/statstest/pause/blkio.throttle.io_serviced", content: "254:0 Read 1\n", errHas: "io_serviced: no Total line"},
		{name: "net/dev bad line", tree: "hybrid-signals", mode: ModeHybrid, ref: source.SandboxRef{SentryPID: 902}, errHas: `testdata/proc/902/net/dev: line 3 "  eth0: 1 2 3": want 16 counters, got 3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", "cgroup", tc.tree))
			if tc.file != "" {
				writeFile(t, filepath.Join(root, tc.file), tc.content)
			}
			mode, ref := tc.mode, tc.ref
			if mode == ModeAuto {
				mode = ModeUnified
			}
			switch {
			case ref.SentryPID != 0:
			case mode == ModeUnified:
				ref.CgroupPath = "/sandbox"
			default:
				ref.CgroupPath = "/statstest/pause"
			}
			ref.Class = source.ClassGVisor
			s, err := Open(ref, Config{CgroupRoot: root, ProcRoot: "testdata/proc", Mode: mode, Logger: discard()})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, err = s.Sample(context.Background())
			if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("Sample() error = %v, want ErrMalformed containing %q", err, tc.errHas)
			}
		})
	}
}

// TestNetworkPinnedToTheSentry: once the sentry is pinned, a pid whose start
// time changed (exited and reused) has its net/dev never read under this
// identity: the network is absent, saying so, even while the cached cgroup is
// still read; a pid that is gone likewise.
func TestNetworkPinnedToTheSentry(t *testing.T) {
	proc := copyTree(t, "testdata/proc")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: 900},
		Config{CgroupRoot: "testdata/cgroup/hybrid-signals", ProcRoot: proc, Mode: ModeHybrid, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	r, err := s.Sample(ctx)
	if err != nil || r.Network == nil || r.Network.Total == nil {
		t.Fatalf("first sample: network %+v, %v", r.Network, err)
	}
	stat := filepath.Join(proc, "900", "stat")
	b, _ := os.ReadFile(stat)
	writeFile(t, stat, strings.Replace(string(b), " 8400 ", " 9999 ", 1)) // another process, same pid
	writeFile(t, filepath.Join(proc, "900", "net", "dev"), netDevHeader+"  eth9: 1 1 0 0 0 0 0 0 99 99 0 0 0 0 0 0\n")
	r, err = s.Sample(ctx)
	if err != nil {
		t.Fatalf("sample after the pid was reused: %v", err)
	}
	if r.Network != nil {
		t.Fatalf("read another process's net/dev under this identity: %+v", r.Network)
	}
	if a := signalsOf(r).Absent; len(a) == 0 || a[len(a)-1].Field != "network" || !strings.Contains(a[len(a)-1].Reason, "sentry pid 900 was reused/exited") {
		t.Fatalf("absent = %+v, want network absent saying the pid was reused", a)
	}
	if err := os.RemoveAll(filepath.Join(proc, "900")); err != nil {
		t.Fatal(err)
	}
	if r, err = s.Sample(ctx); err != nil || r.Network != nil {
		t.Fatalf("sentry gone: network %+v, %v; want absent", r.Network, err)
	}
}

package gvisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func u64(v uint64) *uint64 { return &v }
func u32(v uint32) *uint32 { return &v }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fixture opens a source on a fixture tree under testdata/cgroup.
func fixture(t testing.TB, tree string, mode Mode, ref source.SandboxRef) source.Source {
	t.Helper()
	ref.Class = source.ClassGVisor
	s, err := Open(ref, Config{
		CgroupRoot:  filepath.Join("testdata", "cgroup", tree),
		ProcRoot:    filepath.Join("testdata", "proc"),
		ReadTimeout: time.Second,
		Logger:      discard(),
		Mode:        mode,
	})
	if err != nil {
		t.Fatalf("Open(%+v) on %s: %v", ref, tree, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSampleFixtures(t *testing.T) {
	const (
		v2Dir = "testdata/cgroup/v2/sandbox"
		v1Mem = "testdata/cgroup/v1/memory/statstest/pause"
		v1CPU = "testdata/cgroup/v1/cpuacct/statstest/pause"
		hyMem = "testdata/cgroup/hybrid/memory/statstest/pause"
		hyCPU = "testdata/cgroup/hybrid/cpuacct/statstest/pause"
	)
	v2 := source.Reading{
		Kind:                  source.KindCgroup,
		Detail:                "cgroup v2 (unified) " + v2Dir,
		MemoryCurrentBytes:    268435456,
		MemoryPeakBytes:       u64(301989888),
		MemoryWorkingSetBytes: 268435456 - 4194304,
		CPUUsageUsec:          u64(255682),
		SandboxProcesses:      u32(4),
	}
	v1 := func(mode, mem, cpu, suffix string) source.Reading {
		return source.Reading{
			Kind:                  source.KindCgroup,
			Detail:                "cgroup v1 (" + mode + ") memory " + mem + ", cpuacct " + cpu + suffix,
			MemoryCurrentBytes:    222867456,
			MemoryPeakBytes:       u64(224350208),
			MemoryWorkingSetBytes: 222867456 - 139264,
			CPUUsageUsec:          u64(255682), // 255682885 ns
			SandboxProcesses:      u32(3),
		}
	}
	with := func(r source.Reading, f func(*source.Reading)) source.Reading { f(&r); return r }

	for _, tc := range []struct {
		name    string
		tree    string
		mode    Mode
		ref     source.SandboxRef
		want    source.Reading
		wantErr error  // sentinel, checked with errors.Is
		errHas  string // substring of the error (path, token)
	}{
		{name: "v2 with memory.peak", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"}, want: v2},
		{name: "v2 by sentry pid", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 100},
			want: with(v2, func(r *source.Reading) { r.Detail += " (sentry pid 100)" })},
		{name: "sentry whose command name has spaces and ')'", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 800},
			want: with(v2, func(r *source.Reading) { r.Detail += " (sentry pid 800)" })},
		{name: "sentry stat without ')' is malformed", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 810},
			wantErr: source.ErrMalformed, errHas: "testdata/proc/810/stat"},
		{name: "truncated sentry stat is malformed", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 811},
			wantErr: source.ErrMalformed, errHas: "testdata/proc/811/stat"},
		{name: "sentry start time not a number is malformed", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 812},
			wantErr: source.ErrMalformed, errHas: "testdata/proc/812/stat"},
		{name: "v2 without memory.peak (Linux < 5.19)", tree: "v2-nopeak", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: with(v2, func(r *source.Reading) {
				r.Detail = "cgroup v2 (unified) testdata/cgroup/v2-nopeak/sandbox"
				r.MemoryPeakBytes = nil
				r.SandboxProcesses = u32(1)
				r.Absent = []source.Absent{{Field: "memory_peak_bytes",
					Reason: "memory.peak not offered by this kernel (needs Linux 5.19): no testdata/cgroup/v2-nopeak/sandbox/memory.peak"}}
			})},
		{name: "inactive file larger than current floors at 0", tree: "v2-inactive-gt-current", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: source.Reading{Kind: source.KindCgroup, Detail: "cgroup v2 (unified) testdata/cgroup/v2-inactive-gt-current/sandbox",
				MemoryCurrentBytes: 1048576, MemoryPeakBytes: u64(2097152), MemoryWorkingSetBytes: 0, CPUUsageUsec: u64(255682), SandboxProcesses: u32(1)}},
		{name: "dead sandbox keeps its numbers and says so", tree: "v2-dead", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: source.Reading{Kind: source.KindCgroup, Detail: "cgroup v2 (unified) testdata/cgroup/v2-dead/sandbox",
				MemoryCurrentBytes: 12288, MemoryPeakBytes: u64(301989888), MemoryWorkingSetBytes: 0 /* inactive_file > current */, CPUUsageUsec: u64(255682), SandboxProcesses: u32(0)}},
		{name: "no memory.stat or cpu.stat: working set is usage, cpu absent", tree: "v2-missing-stat", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			want: source.Reading{Kind: source.KindCgroup, Detail: "cgroup v2 (unified) testdata/cgroup/v2-missing-stat/sandbox",
				MemoryCurrentBytes: 268435456, MemoryPeakBytes: u64(301989888), MemoryWorkingSetBytes: 268435456, SandboxProcesses: u32(1),
				Absent: []source.Absent{{Field: "cpu_usage_usec", Reason: "no usage_usec in testdata/cgroup/v2-missing-stat/sandbox/cpu.stat"}}}},
		{name: "max in memory.current is malformed", tree: "v2-max", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			wantErr: source.ErrMalformed, errHas: `testdata/cgroup/v2-max/sandbox/memory.current: token "max"`},
		{name: "malformed memory.stat line", tree: "v2-malformed-stat", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			wantErr: source.ErrMalformed, errHas: `memory.stat: line 2 "inactive_file 4x94304": token "4x94304"`},
		{name: "malformed cpu.stat line", tree: "v2-malformed-cpu", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			wantErr: source.ErrMalformed, errHas: `cpu.stat: line 1 "usage_usec 255682 12"`},
		{name: "memory controller not enabled", tree: "v2-nomemory", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/sandbox"},
			wantErr: source.ErrNotMeasurable, errHas: "has no memory.current"},
		{name: "missing cgroup", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{CgroupPath: "/not/created/yet"},
			wantErr: errCgroupGone, errHas: "testdata/cgroup/v2/not/created/yet"},
		{name: "sentry pid gone", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 999},
			wantErr: source.ErrNotMeasurable, errHas: "sentry pid 999 is gone"},
		{name: "sentry outside our cgroup namespace", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 400},
			wantErr: source.ErrNotMeasurable, errHas: "outside this process's cgroup namespace"},
		{name: "sentry in a deleted cgroup", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 500},
			wantErr: errCgroupGone},
		{name: "v1 legacy by path", tree: "v1", mode: ModeLegacy, ref: source.SandboxRef{CgroupPath: "/statstest/pause"},
			want: v1("legacy", "testdata/cgroup/v1/memory/statstest/pause", v1CPU, "")},
		{name: "v1 legacy by sentry pid (cpu,cpuacct co-mounted line)", tree: "v1", mode: ModeLegacy, ref: source.SandboxRef{SentryPID: 200},
			want: v1("legacy", v1Mem, v1CPU, " (sentry pid 200)")},
		{name: "hybrid by sentry pid: v1 lines win over 0::/", tree: "hybrid", mode: ModeHybrid, ref: source.SandboxRef{SentryPID: 300},
			want: v1("hybrid", hyMem, hyCPU, " (sentry pid 300)")},
		{name: "hybrid pid with only a 0:: line", tree: "hybrid", mode: ModeHybrid, ref: source.SandboxRef{SentryPID: 100},
			wantErr: source.ErrNotMeasurable, errHas: "no v1 memory line"},
		{name: "unified pid with only v1 lines", tree: "v2", mode: ModeUnified, ref: source.SandboxRef{SentryPID: 200},
			wantErr: source.ErrNotMeasurable, errHas: `no cgroup v2 ("0::") line`},
		{name: "sentry in the root cgroup (--ignore-cgroups)", tree: "hybrid", mode: ModeHybrid, ref: source.SandboxRef{SentryPID: 600},
			wantErr: source.ErrNotMeasurable, errHas: "root cgroup"},
		{name: "v1 without cpuacct hierarchy: cpu absent", tree: "v1-nocpuacct", mode: ModeLegacy, ref: source.SandboxRef{CgroupPath: "/statstest/pause"},
			want: with(v1("legacy", "", "", ""), func(r *source.Reading) {
				r.Detail = "cgroup v1 (legacy) memory testdata/cgroup/v1-nocpuacct/memory/statstest/pause, cpuacct (none)"
				r.CPUUsageUsec = nil
				r.Absent = []source.Absent{{Field: "cpu_usage_usec",
					Reason: "no cpuacct hierarchy: open testdata/cgroup/v1-nocpuacct/cpuacct: no such file or directory"}}
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture(t, tc.tree, tc.mode, tc.ref)
			got, err := s.Sample(context.Background())
			if tc.wantErr != nil || tc.errHas != "" {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Sample() error = %v, want %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("Sample() error = %q, want it to contain %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("Sample() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got, coreOnly); diff != "" {
				t.Errorf("Sample() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// coreOnly compares the memory, CPU and process parts of a Reading: the
// signals and traffic parts, and their absent entries, have their own table
// (TestSampleSignals).
var coreOnly = cmp.Transformer("core", func(r source.Reading) source.Reading {
	r.Memory, r.Throttling, r.Pressure, r.Pids, r.Network, r.BlockIO = nil, nil, nil, nil, nil, nil
	var keep []source.Absent
	for _, a := range r.Absent {
		switch a.Field {
		case "memory_peak_bytes", "cpu_usage_usec", "sandbox_processes":
			keep = append(keep, a)
		}
	}
	r.Absent = keep
	return r
})

// TestOpenNotACgroupMount: with mode detection, a root that is no cgroup
// mount is not measurable. (Open trusts the ref: identity.ValidateRef's
// table holds the refs it must never get.)
func TestOpenNotACgroupMount(t *testing.T) {
	if _, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a"}, Config{CgroupRoot: t.TempDir()}); !errors.Is(err, source.ErrNotMeasurable) {
		t.Errorf("Open on a plain directory with mode detection: err = %v, want ErrNotMeasurable", err)
	}
}

// copyTree copies a fixture tree into a temporary directory the test may
// change.
func copyTree(t *testing.T, from string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestNoSymlinkEscape: a cgroup path that is a symlink out of the cgroup
// mount is not followed.
func TestNoSymlinkEscape(t *testing.T) {
	outside := copyTree(t, "testdata/cgroup/v2")
	cg := t.TempDir()
	if err := os.Symlink(filepath.Join(outside, "sandbox"), filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"}, Config{CgroupRoot: cg, Mode: ModeUnified})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Sample(context.Background())
	if err == nil {
		t.Fatalf("Sample through a symlink out of the root = %+v, want an error", r)
	}
	if !errors.Is(err, source.ErrNotMeasurable) {
		t.Errorf("err = %v, want ErrNotMeasurable", err)
	}
}

func TestDetectModeThisHost(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("cgroups are Linux-only")
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		t.Skip("no /sys/fs/cgroup")
	}
	m, err := detectMode("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this host: %v", m)
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err == nil && m != ModeHybrid {
		t.Errorf("mode = %v, want hybrid (cgroup2 at /sys/fs/cgroup/unified)", m)
	}
	if m, err := detectMode(t.TempDir()); err == nil {
		t.Errorf("detectMode(plain dir) = %v, want an error", m)
	}
}

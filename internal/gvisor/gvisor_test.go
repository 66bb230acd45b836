package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
			wantErr: source.ErrNotMeasurable, errHas: "outside this cgroup namespace"},
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
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Sample() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOpenRejects(t *testing.T) {
	cfg := Config{CgroupRoot: "testdata/cgroup/v2", Mode: ModeUnified}
	for _, tc := range []struct {
		name string
		ref  source.SandboxRef
	}{
		{"neither path nor pid", source.SandboxRef{Class: source.ClassGVisor}},
		{"both path and pid", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", SentryPID: 1}},
		{"relative path", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "a/b"}},
		{"dot-dot", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a/../../etc"}},
		{"unclean", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a//b/"}},
		{"root cgroup", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/"}},
		{"negative pid", source.SandboxRef{Class: source.ClassGVisor, SentryPID: -4}},
		{"micro-VM class", source.SandboxRef{Class: source.ClassMicroVM, CgroupPath: "/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := Open(tc.ref, cfg); err == nil {
				s.Close()
				t.Fatalf("Open(%+v) = nil error", tc.ref)
			}
		})
	}
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

// TestSentryCgroupMoves: a source opened by sentry pid follows the sentry
// when its cgroup disappears, keeps reading a dead sandbox's cgroup while it
// remains, and says not measurable when both are gone.
func TestSentryCgroupMoves(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	proc := t.TempDir()
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
	writeStat(t, proc, 42, 5000)
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42},
		Config{CgroupRoot: cg, ProcRoot: proc, Mode: ModeUnified, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	sample := func() (source.Reading, error) { return s.Sample(ctx) }

	if r, err := sample(); err != nil || !strings.HasSuffix(r.Detail, "/sandbox (sentry pid 42)") {
		t.Fatalf("first sample = %q, %v", r.Detail, err)
	}
	// The sandbox moves: the old cgroup disappears, /proc shows the new one.
	if err := os.CopyFS(filepath.Join(cg, "moved"), os.DirFS(filepath.Join(cg, "sandbox"))); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/moved\n")
	r, err := sample()
	if err != nil || !strings.HasSuffix(r.Detail, "/moved (sentry pid 42)") {
		t.Fatalf("after the move: sample = %q, %v; want the moved cgroup", r.Detail, err)
	}
	// The sentry dies but its cgroup stays: the cached path is still read.
	if err := os.RemoveAll(filepath.Join(proc, "42")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cg, "moved", "cgroup.procs"), "")
	r, err = sample()
	if err != nil || r.SandboxProcesses == nil || *r.SandboxProcesses != 0 || r.MemoryCurrentBytes != 268435456 {
		t.Fatalf("dead sandbox: sample = %+v, %v; want its numbers and 0 processes", r, err)
	}
	// The cgroup goes too.
	if err := os.RemoveAll(filepath.Join(cg, "moved")); err != nil {
		t.Fatal(err)
	}
	if _, err := sample(); !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, source.ErrSandboxGone) || !strings.Contains(err.Error(), "sentry pid 42 was reused/exited") {
		t.Fatalf("cgroup and sentry gone: err = %v, want ErrNotMeasurable and ErrSandboxGone naming the pid", err)
	}
}

// writeStat writes a /proc/<pid>/stat whose field 22 (starttime) is start;
// the command name has spaces and a ')' as a real one may.
func writeStat(t *testing.T, proc string, pid int, start uint64) {
	t.Helper()
	writeFile(t, filepath.Join(proc, strconv.Itoa(pid), "stat"), fmt.Sprintf(
		"%d (runsc ) sandbox) S 1 %d %d 0 -1 4194560 9031 0 0 0 312 55 0 0 20 0 14 0 %d 1300475904 12001 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		pid, pid, pid, start))
}

// TestSentryPIDReused: the sentry's cgroup disappears and its pid now
// belongs to another process (another start time) in another cgroup, or the
// pid is gone: the source must not read that cgroup under this identity.
func TestSentryPIDReused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(t *testing.T, proc string)
	}{
		{"pid reused by a process in another cgroup", func(t *testing.T, proc string) {
			writeStat(t, proc, 42, 9999)
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/other\n")
		}},
		{"pid exited", func(t *testing.T, proc string) {
			if err := os.RemoveAll(filepath.Join(proc, "42")); err != nil {
				t.Fatal(err)
			}
		}},
		{"same process moved (control)", func(t *testing.T, proc string) {
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/other\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := copyTree(t, "testdata/cgroup/v2")
			if err := os.CopyFS(filepath.Join(cg, "other"), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
				t.Fatal(err)
			}
			proc := t.TempDir()
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
			writeStat(t, proc, 42, 5000)
			s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42},
				Config{CgroupRoot: cg, ProcRoot: proc, Mode: ModeUnified, Logger: discard()})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			if r, err := s.Sample(ctx); err != nil || r.MemoryCurrentBytes != 268435456 {
				t.Fatalf("first sample = %d, %v", r.MemoryCurrentBytes, err)
			}
			if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
				t.Fatal(err)
			}
			tc.after(t, proc)
			r, err := s.Sample(ctx)
			if strings.HasPrefix(tc.name, "same process") {
				if err != nil || r.MemoryCurrentBytes != 12288 {
					t.Fatalf("moved sentry: sample = %d, %v; want the new cgroup's 12288", r.MemoryCurrentBytes, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("sample = %+v (the other cgroup's numbers), want an error", r)
			}
			if !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, source.ErrSandboxGone) || !strings.Contains(err.Error(), "sentry pid 42 was reused/exited") {
				t.Fatalf("err = %v, want ErrNotMeasurable and ErrSandboxGone, \"sentry pid 42 was reused/exited\"", err)
			}
		})
	}
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

// TestCgroupRemadeIsReadAfresh: the reader keeps the cgroup directory open
// between samples; when the cgroup is removed and made again under the same
// path, the new one is read, and while it is missing the sample says so.
func TestCgroupRemadeIsReadAfresh(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"}, Config{CgroupRoot: cg, Mode: ModeUnified})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if r, err := s.Sample(ctx); err != nil || r.MemoryCurrentBytes != 268435456 {
		t.Fatalf("first sample = %d, %v", r.MemoryCurrentBytes, err)
	}
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx); !errors.Is(err, errCgroupGone) || !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, source.ErrSandboxGone) {
		t.Fatalf("removed cgroup: err = %v, want ErrNotMeasurable and ErrSandboxGone (no such cgroup)", err)
	}
	if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Sample(ctx); err != nil || r.MemoryCurrentBytes != 12288 {
		t.Fatalf("remade cgroup: sample = %d, %v; want the new cgroup's 12288", r.MemoryCurrentBytes, err)
	}
}

// TestSharedDirStatPerHandle: two callers hold different handles on the same
// cgroup path (one on a removed directory, one on the directory made again)
// and share one stat of that path. Each must get "same" for its own handle,
// not the answer computed for the other's.
func TestSharedDirStatPerHandle(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	src, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, ReadTimeout: 10 * time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := src.(*cgroupSource)
	stale, err := s.unified.OpenRoot("sandbox")
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
		t.Fatal(err)
	}
	fresh, err := s.unified.OpenRoot("sandbox")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHook = func(op string) {
		if op != "stat" {
			return
		}
		once.Do(func() { close(entered) })
		<-release
	}
	defer func() { testHook = nil }()

	type result struct{ exists, same bool }
	ctx := context.Background()
	var freshRes, staleRes result
	var wg sync.WaitGroup
	wg.Go(func() {
		e, same, err := s.dirState(ctx, s.unified, "/sandbox", fresh)
		if err != nil {
			t.Errorf("fresh handle: %v", err)
		}
		freshRes = result{e, same}
	})
	<-entered // the first caller's shared stat is in flight and held
	wg.Go(func() {
		e, same, err := s.dirState(ctx, s.unified, "/sandbox", stale)
		if err != nil {
			t.Errorf("stale handle: %v", err)
		}
		staleRes = result{e, same}
	})
	time.Sleep(100 * time.Millisecond) // let the second caller join the held call
	close(release)
	wg.Wait()
	if want := (result{true, true}); freshRes != want {
		t.Errorf("fresh handle: %+v, want %+v", freshRes, want)
	}
	if want := (result{true, false}); staleRes != want {
		t.Errorf("stale handle (joined the fresh caller's stat): %+v, want %+v", staleRes, want)
	}
}

// TestDirOpenedAfterCloseIsNotCached: a cgroup directory whose open finishes
// after Close is closed, not stored in the cache (where nothing would ever
// close it).
func TestDirOpenedAfterCloseIsNotCached(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	src, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, ReadTimeout: 10 * time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	s := src.(*cgroupSource)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHook = func(op string) {
		if op != "open" {
			return
		}
		once.Do(func() { close(entered) })
		<-release
	}
	defer func() { testHook = nil }()
	done := make(chan error, 1)
	go func() { _, err := s.Sample(context.Background()); done <- err }()
	<-entered // the directory is open, not yet cached
	s.Close()
	close(release)
	if err := <-done; err == nil {
		t.Errorf("Sample racing Close succeeded; want an error")
	}
	s.mu.Lock()
	n := len(s.dirs)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d directories cached after Close, want 0 (a leaked handle)", n)
	}
}

// TestRecreatedCgroupDoesNotPinHandles: each time the cgroup is removed and
// made again, the handle on the removed directory is closed once no read
// uses it, not kept (pinning a dying memcg) until Close.
func TestRecreatedCgroupDoesNotPinHandles(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	cg := copyTree(t, "testdata/cgroup/v2")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	if _, err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	before := fds()
	const n = 20
	for i := range n {
		if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sample(ctx); err != nil {
			t.Fatalf("sample after recreation %d: %v", i, err)
		}
	}
	if after := fds(); after > before+2 {
		t.Errorf("open fds: %d before, %d after %d recreations of the cgroup; want no growth", before, after, n)
	}
}

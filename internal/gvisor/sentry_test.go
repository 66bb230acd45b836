package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestSentryCgroupMoves: a source opened by sentry pid follows the sentry
// when its cgroup disappears, keeps reading a dead sandbox's cgroup while it
// remains, and says not measurable when both are gone.
func TestSentryCgroupMoves(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	proc := t.TempDir()
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
	writeStat(t, proc, 42, 5000)
	s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42})
	ctx := context.Background()
	sample := func() (source.Reading, error) { return s.Sample(ctx) }

	if r, err := sample(); err != nil || !strings.HasSuffix(r.Detail, "/sandbox (sentry pid 42)") {
		t.Fatalf("first sample = %q, %v", r.Detail, err)
	}
	// A directory of the old location that stays (as a v1 aux hierarchy's
	// may): dropped with the old location's at the move.
	cs := s.(*cgroupSource)
	if err := os.Mkdir(filepath.Join(cg, "aux"), 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := cs.acquireDir(cs.unified, "/aux")
	if err != nil {
		t.Fatal(err)
	}
	cs.releaseDir(h)
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
	cs.mu.Lock()
	for id := range cs.dirs {
		if id.dir == "/sandbox" || id.dir == "/aux" {
			t.Errorf("after the move: the old cgroup %s is still held", id.dir)
		}
	}
	cs.mu.Unlock()
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

// openSentryFixture opens a source by sentry pid 42 (start time 5000) in
// /sandbox of a v2 fixture tree that also holds a dead sandbox's cgroup at
// /other, and returns it with the cgroup and proc roots.
func openSentryFixture(t *testing.T) (s source.Source, cg, proc string) {
	t.Helper()
	cg = copyTree(t, "testdata/cgroup/v2")
	if err := os.CopyFS(filepath.Join(cg, "other"), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
		t.Fatal(err)
	}
	proc = t.TempDir()
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
	writeStat(t, proc, 42, 5000)
	return openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42}), cg, proc
}

// openSentry opens ref on the v2 fixture tree cg with the proc root proc;
// the test's cleanup closes it.
func openSentry(t *testing.T, cg, proc string, ref source.SandboxRef) source.Source {
	t.Helper()
	s, err := Open(ref, Config{CgroupRoot: cg, ProcRoot: proc, Mode: ModeUnified, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
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
			s, cg, proc := openSentryFixture(t)
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

// oomKilled is the fixture's sentry killed by the OOM killer: /proc/42
// gone, one kill in memory.events, procs left in the cgroup.
func oomKilled(procs string) func(t *testing.T, cg, proc string) {
	return func(t *testing.T, cg, proc string) {
		if err := os.RemoveAll(filepath.Join(proc, "42")); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(cg, "sandbox", "memory.events"), "low 0\nhigh 0\nmax 57\noom 1\noom_kill 1\noom_group_kill 0\n")
		writeFile(t, filepath.Join(cg, "sandbox", "cgroup.procs"), procs)
	}
}

// TestSentryDiesBeforeFirstSample is issue 20: a source opened by sentry pid
// resolves and pins the sentry's cgroup at Open, so that a sentry that dies
// (OOM-killed) before the first Sample is still read from the cgroup it
// left, and a pid reused before the first Sample is still refused.
func TestSentryDiesBeforeFirstSample(t *testing.T) {
	for _, tc := range []struct {
		name   string
		after  func(t *testing.T, cg, proc string)
		errHas string // "" wants a reading
	}{
		{"OOM-killed: a process left in the cgroup", oomKilled("43\n"), ""},
		{"OOM-killed: the cgroup remains", oomKilled(""), ""},
		{"pid reused by a process in another cgroup, the cgroup gone", func(t *testing.T, cg, proc string) {
			if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
				t.Fatal(err)
			}
			writeStat(t, proc, 42, 9999)
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/other\n")
		}, "sentry pid 42 was reused/exited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, cg, proc := openSentryFixture(t)
			tc.after(t, cg, proc)
			r, err := s.Sample(context.Background())
			if tc.errHas != "" {
				if err == nil {
					t.Fatalf("sample = %+v (the other cgroup's numbers), want an error", r)
				}
				if !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, source.ErrSandboxGone) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want ErrNotMeasurable and ErrSandboxGone, %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("sample of a sentry dead before the first sample: %v; want the cgroup it left", err)
			}
			if !strings.Contains(r.Detail, "/sandbox (sentry pid 42)") || r.MemoryCurrentBytes != 268435456 {
				t.Errorf("sample = %q, %d bytes; want the sandbox cgroup's 268435456", r.Detail, r.MemoryCurrentBytes)
			}
			if !r.SentryExited || !strings.HasSuffix(r.Detail, ": the sentry has exited") {
				t.Errorf("sentry exited %v, detail %q; want true, said", r.SentryExited, r.Detail)
			}
			if r.Memory == nil || r.Memory.OOMKills == nil || *r.Memory.OOMKills != 1 {
				t.Errorf("memory signals = %+v, want oom_kills 1", r.Memory)
			}
		})
	}
}

// TestSentryStartsAfterOpen: a sentry pid not there at Open (the launcher
// bound it early) is resolved, and pinned, at the first Sample that finds it.
func TestSentryStartsAfterOpen(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	proc := t.TempDir()
	s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42})
	ctx := context.Background()
	if _, err := s.Sample(ctx); !errors.Is(err, source.ErrNotMeasurable) || errors.Is(err, source.ErrSandboxGone) || !strings.Contains(err.Error(), "sentry pid 42 is gone") {
		t.Fatalf("before the sentry starts: err = %v, want ErrNotMeasurable, not ErrSandboxGone, \"sentry pid 42 is gone\"", err)
	}
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
	writeStat(t, proc, 42, 5000)
	if r, err := s.Sample(ctx); err != nil || !strings.HasSuffix(r.Detail, "/sandbox (sentry pid 42)") {
		t.Fatalf("after the sentry starts: sample = %q, %v; want its cgroup", r.Detail, err)
	}
	writeStat(t, proc, 42, 9999) // reused
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx); !errors.Is(err, source.ErrSandboxGone) || !strings.Contains(err.Error(), "sentry pid 42 was reused/exited") {
		t.Fatalf("pid reused: err = %v, want ErrSandboxGone, \"sentry pid 42 was reused/exited\"", err)
	}
}

// TestSentryPinnedByRef: a ref carrying the sentry's start time (a binding a
// restarted statsd restores) is pinned to it from Open: the same process is
// read, another process now holding the pid is refused, never read.
func TestSentryPinnedByRef(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start uint64 // the start time of the process now holding pid 42
		ok    bool
	}{
		{"the same sentry", 5000, true},
		{"pid reused while statsd was down", 9999, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := copyTree(t, "testdata/cgroup/v2")
			proc := t.TempDir()
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/sandbox\n")
			writeStat(t, proc, 42, tc.start)
			s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42, SentryStartTicks: 5000})
			if ticks, ok := s.(interface{ SentryStartTicks() (uint64, bool) }).SentryStartTicks(); ticks != 5000 || !ok {
				t.Errorf("pinned start = %d, %v; want 5000, true", ticks, ok)
			}
			r, err := s.Sample(context.Background())
			switch {
			case tc.ok && (err != nil || !strings.HasSuffix(r.Detail, "/sandbox (sentry pid 42)")):
				t.Errorf("sample = %q, %v; want the sandbox", r.Detail, err)
			case !tc.ok && (err == nil || !errors.Is(err, source.ErrSandboxGone)):
				t.Errorf("sample = %q, %v; want ErrSandboxGone", r.Detail, err)
			}
		})
	}
}

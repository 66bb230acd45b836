package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationKeptFilesRealCgroupV1: on this host's real v1 hierarchies a
// source keeps the cgroup's files open (pread at 0 each sample, the count
// steady and bounded), reads a cgroup removed and made again under the same
// path afresh (the new limit, never the old cgroup's), says a removed one is
// gone, and closes every kept descriptor at Close.
func TestIntegrationKeptFilesRealCgroupV1(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to create cgroups")
	const root = "/sys/fs/cgroup"
	mode, err := detectMode(root)
	testenv.Need(t, err == nil && (mode == ModeHybrid || mode == ModeLegacy), fmt.Sprintf("needs v1 hierarchies at %s (mode %v, %v)", root, mode, err))
	name := fmt.Sprintf("sbskept-%d-%d", os.Getpid(), time.Now().UnixNano())
	var dirs []string
	for _, h := range []string{"memory", "cpuacct", "cpu", "pids", "blkio"} {
		if _, err := os.Stat(filepath.Join(root, h)); err == nil {
			dirs = append(dirs, filepath.Join(root, h, name))
		}
	}
	if mode == ModeHybrid {
		dirs = append(dirs, filepath.Join(root, "unified", name))
	}
	memDir := filepath.Join(root, "memory", name)
	testenv.MakeCgroup(t, dirs...)
	setLimit := func(mib int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(memDir, "memory.limit_in_bytes"), fmt.Appendf(nil, "%d", mib<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setLimit(64)

	base := keptOpen.Load()
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/" + name}, Config{CgroupRoot: root, ReadTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	ctx := context.Background()
	limit := func() uint64 {
		t.Helper()
		r, err := s.Sample(ctx)
		if err != nil {
			t.Fatalf("Sample: %v", err)
		}
		if r.Memory == nil || r.Memory.LimitBytes == nil {
			t.Fatalf("Sample has no memory limit: %+v", r)
		}
		return r.Memory.LimitBytes.Value
	}
	if got := limit(); got != 64<<20 {
		t.Fatalf("limit = %d, want 64 MiB", got)
	}
	kept := keptOpen.Load() - base
	fds := countFDs(t)
	for range 5 {
		limit()
	}
	if k, f := keptOpen.Load()-base, countFDs(t); k != kept || f != fds {
		t.Errorf("after 5 more samples: %d kept, %d descriptors; want %d and %d (steady)", k, f, kept, fds)
	}
	// Every file read but cgroup.procs, in memory (5), cpuacct (1), cpu (3),
	// pids (2), blkio (2 here, 2 in the root cgroup) and unified (3).
	if kept < 5 || kept > int64(len(dirs)+1)*maxKeptPerDir {
		t.Errorf("%d files kept, want at least the memory hierarchy's 5 and at most %d", kept, (len(dirs)+1)*maxKeptPerDir)
	}
	t.Logf("one v1 source keeps %d files open (%d descriptors in the test process)", kept, fds)

	// Removed and made again under the same path, with another limit.
	if err := testenv.RmdirRetry(memDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(memDir, 0o755); err != nil {
		t.Fatal(err)
	}
	setLimit(32)
	if got := limit(); got != 32<<20 {
		t.Fatalf("after the cgroup was made again: limit = %d, want the new cgroup's 32 MiB", got)
	}
	if k := keptOpen.Load() - base; k != kept {
		t.Errorf("after the cgroup was made again: %d kept, want %d (the old ones closed, the new ones kept)", k, kept)
	}

	// Every hierarchy's cgroup removed and made again (review F4): the cpu,
	// pids and blkio hierarchies, read only through optional files, follow
	// to the new cgroups in the first sample, never "no <file>".
	for _, d := range dirs {
		if err := testenv.RmdirRetry(d); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setLimit(48)
	pidsDir, cpuDir := filepath.Join(root, "pids", name), filepath.Join(root, "cpu", name)
	writeFile(t, filepath.Join(pidsDir, "pids.max"), "50")
	writeFile(t, filepath.Join(cpuDir, "cpu.cfs_quota_us"), "20000")
	for i := range 3 {
		r, err := s.Sample(ctx)
		if err != nil {
			t.Fatalf("sample %d after every cgroup was made again: %v", i, err)
		}
		if r.Memory == nil || r.Memory.LimitBytes == nil || r.Memory.LimitBytes.Value != 48<<20 {
			t.Errorf("sample %d: memory signals %+v, want the new cgroup's 48 MiB limit", i, r.Memory)
		}
		if r.Pids == nil || r.Pids.Limit == nil || r.Pids.Limit.Value != 50 {
			t.Errorf("sample %d: pids %+v, want the new cgroup's limit 50", i, r.Pids)
		}
		if r.Throttling == nil || r.Throttling.QuotaUsec == nil || r.Throttling.QuotaUsec.Value != 20000 {
			t.Errorf("sample %d: cpu throttling %+v, want the new cgroup's quota 20000", i, r.Throttling)
		}
		for _, a := range r.Absent {
			if strings.HasPrefix(a.Reason, "no /sys/fs/cgroup/") {
				t.Errorf("sample %d: %s absent: %s", i, a.Field, a.Reason)
			}
		}
		if r.BlockIO == nil && !slices.ContainsFunc(r.Absent, func(a source.Absent) bool { return a.Field == "block_io" }) {
			t.Errorf("sample %d: block_io neither read nor absent", i)
		}
	}
	if k := keptOpen.Load() - base; k != kept {
		t.Errorf("after every cgroup was made again: %d kept, want %d", k, kept)
	}

	// Removed: the sample says so, and no descriptor of it stays kept.
	if err := testenv.RmdirRetry(memDir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx); !errors.Is(err, source.ErrNotMeasurable) {
		t.Fatalf("Sample of a removed cgroup: %v, want ErrNotMeasurable", err)
	}
	if k := keptOpen.Load() - base; k >= kept {
		t.Errorf("after the memory cgroup was removed: %d kept, want fewer than %d", k, kept)
	}
	closed = true
	s.Close()
	if k := keptOpen.Load() - base; k != 0 {
		t.Errorf("after Close: %d kept, want 0", k)
	}
	if err := os.Mkdir(memDir, 0o755); err != nil { // for MakeCgroup's cleanup
		t.Fatal(err)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

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
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

const mib = 1 << 20

// within reports whether got is want ± frac·want.
func within(got, want int64, frac float64) bool {
	d := got - want
	return float64(max(d, -d)) <= frac*float64(want)
}

// TestIntegrationRealCgroup makes a v1 memory+cpuacct cgroup (and a v2
// cgroup under the hybrid host's unified mount, which offers cpu.stat only;
// on a unified host one v2 cgroup), moves a child process in, has it allocate 160 MiB and burn 1 s of CPU, and
// checks that the source's figures move by that much:
//
//   - memory current rises by 160 MiB ± 10 % and falls back by ≥ 140 MiB
//     when the child frees it; peak keeps the high value;
//   - CPU (v1 cpuacct.usage and/or v2 cpu.stat usage_usec) rises by the CPU the
//     child measured itself with getrusage, ± 10 % + 20 ms;
//   - sandbox_processes is 1, then 0 once the child is dead (the numbers
//     are still there);
//   - the source opened by the child's pid reads the same cgroup.
func TestIntegrationRealCgroup(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to create cgroups (sudo go test -run TestIntegrationRealCgroup ./internal/gvisor)")
	const root = "/sys/fs/cgroup"
	mode, err := detectMode(root)
	testenv.Need(t, err == nil, fmt.Sprintf("needs a cgroup mount at %s: %v", root, err))
	name := fmt.Sprintf("sbstest-%d-%d", os.Getpid(), time.Now().UnixNano())
	// The directories the child joins: v1 memory and cpuacct (plus the
	// unified mount's cgroup on a hybrid host, for cpu.stat), or one v2
	// cgroup with the memory controller.
	var dirs []string
	unified := ""
	if mode == ModeHybrid || mode == ModeLegacy {
		memDir, cpuDir := filepath.Join(root, "memory"), filepath.Join(root, "cpuacct")
		_, err = os.Stat(cpuDir)
		testenv.Need(t, err == nil, "needs the v1 cpuacct hierarchy at "+cpuDir)
		dirs = []string{filepath.Join(memDir, name), filepath.Join(cpuDir, name)}
		if mode == ModeHybrid {
			unified = filepath.Join(root, "unified", name)
			dirs = append(dirs, unified)
		}
	} else {
		ctl, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
		testenv.Need(t, strings.Contains(" "+strings.TrimSpace(string(ctl))+" ", " memory "),
			"needs the memory controller enabled in "+root+"/cgroup.subtree_control")
		dirs = []string{filepath.Join(root, name)}
	}
	for _, d := range dirs {
		mkCgroup(t, d)
	}
	// Cleanups run last-in first-out: the child (registered below) dies
	// before the cgroups are removed.
	c := testenv.StartChild(t, "TestHelperChild")
	pid := c.Cmd.Process.Pid
	for _, d := range dirs {
		join(t, d, pid)
	}

	ctx := context.Background()
	open := func(ref source.SandboxRef, cfg Config) source.Source {
		ref.Class = source.ClassGVisor
		cfg.Logger = discard()
		s, err := Open(ref, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	byPath := open(source.SandboxRef{CgroupPath: "/" + name}, Config{CgroupRoot: root, ProcRoot: "/proc"})
	byPID := open(source.SandboxRef{SentryPID: pid}, Config{CgroupRoot: root, ProcRoot: "/proc"})
	sample := func(s source.Source) source.Reading {
		t.Helper()
		r, err := s.Sample(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// v2 on this host: cpu.stat only, so a source says not measurable and
	// the file is read and parsed here.
	if unified != "" {
		v2 := open(source.SandboxRef{CgroupPath: "/" + name}, Config{CgroupRoot: filepath.Join(root, "unified"), Mode: ModeUnified})
		if _, err := v2.Sample(ctx); !errors.Is(err, source.ErrNotMeasurable) {
			t.Errorf("v2 cgroup without the memory controller: err = %v, want ErrNotMeasurable", err)
		}
	}
	v2cpu := func() int64 {
		t.Helper()
		if unified == "" {
			return 0
		}
		p := filepath.Join(unified, "cpu.stat")
		b, err := bounded.ReadFile(p, bounded.MaxFileBytes)
		if err != nil {
			t.Fatal(err)
		}
		v, ok, err := parseKeyed(b, "usage_usec")
		if err != nil || !ok {
			t.Fatalf("%s usage_usec: %d, %v, %v", p, v, ok, err)
		}
		return int64(v)
	}

	r0 := sample(byPath)
	t.Logf("idle:   %s", fmtReading(r0))
	if r0.SandboxProcesses == nil || *r0.SandboxProcesses != 1 {
		t.Errorf("sandbox processes = %v, want 1", r0.SandboxProcesses)
	}
	if p := sample(byPID); !strings.Contains(p.Detail, "/"+name) || !strings.Contains(p.Detail, "(sentry pid") {
		t.Errorf("by pid: detail %q, want the test cgroup", p.Detail)
	}

	if raceEnabled {
		t.Skip("the race detector multiplies the child's memory; run without -race")
	}
	const allocMiB = 160
	c.Do(t, "alloc "+strconv.Itoa(allocMiB))
	r1 := sample(byPath)
	t.Logf("alloc:  %s", fmtReading(r1))
	grew := int64(r1.MemoryCurrentBytes) - int64(r0.MemoryCurrentBytes)
	if !within(grew, allocMiB*mib, 0.10) {
		t.Errorf("memory current rose by %.1f MiB after allocating %d MiB, want ±10%%", float64(grew)/mib, allocMiB)
	}
	if r1.MemoryPeakBytes == nil || *r1.MemoryPeakBytes < r1.MemoryCurrentBytes {
		t.Errorf("peak %v below current %d", r1.MemoryPeakBytes, r1.MemoryCurrentBytes)
	}
	if ws := int64(r1.MemoryWorkingSetBytes) - int64(r0.MemoryWorkingSetBytes); !within(ws, allocMiB*mib, 0.10) {
		t.Errorf("working set rose by %.1f MiB, want %d MiB ±10%% (anonymous memory)", float64(ws)/mib, allocMiB)
	}

	v2Before := v2cpu()
	ans := c.Do(t, "burn 1000")
	var used int64
	fmt.Sscanf(ans, "ok %d", &used)
	r2 := sample(byPath)
	v2After := v2cpu()
	t.Logf("burn:   %s (child's own getrusage: %d us)", fmtReading(r2), used)
	cpu := int64(*r2.CPUUsageUsec) - int64(*r1.CPUUsageUsec)
	tol := func(want int64) float64 { return 0.10 + 20000/float64(want) }
	if !within(cpu, used, tol(used)) {
		t.Errorf("cpu_usage_usec (%v) rose by %d us, the child used %d us (want ±10%% + 20 ms)", mode, cpu, used)
	}
	if unified != "" {
		t.Logf("v2 cpu.stat usage_usec rose by %d us", v2After-v2Before)
		if d := v2After - v2Before; !within(d, used, tol(used)) {
			t.Errorf("v2 cpu.stat rose by %d us, the child used %d us (want ±10%% + 20 ms)", d, used)
		}
	}

	c.Do(t, "free")
	r3 := sample(byPath)
	t.Logf("free:   %s", fmtReading(r3))
	if fell := int64(r2.MemoryCurrentBytes) - int64(r3.MemoryCurrentBytes); fell < (allocMiB-20)*mib {
		t.Errorf("memory current fell by %.1f MiB after freeing %d MiB", float64(fell)/mib, allocMiB)
	}
	if r3.MemoryPeakBytes == nil || *r3.MemoryPeakBytes < r1.MemoryCurrentBytes {
		t.Errorf("peak %v after free, want at least %d (kept)", r3.MemoryPeakBytes, r1.MemoryCurrentBytes)
	}

	c.Kill()
	for _, s := range []source.Source{byPath, byPID} {
		r := sample(s)
		if r.SandboxProcesses == nil || *r.SandboxProcesses != 0 {
			t.Errorf("after the child died: sandbox processes = %v, want 0 (%s)", r.SandboxProcesses, r.Detail)
		}
		if r.MemoryPeakBytes == nil || *r.MemoryPeakBytes < r1.MemoryCurrentBytes || *r.CPUUsageUsec < *r2.CPUUsageUsec {
			t.Errorf("dead sandbox lost its numbers: %s", fmtReading(r))
		}
	}
	t.Logf("dead:   %s", fmtReading(sample(byPID)))
	if mode == ModeUnified {
		// With no process left the peak and the CPU stand still: they equal
		// the kernel's own files to the byte and microsecond. The dead
		// child's last pages still leave the charge meanwhile.
		besideKernelV2(t, dirs[0], byPath, 1<<20)
	}
}

// besideKernelV2 samples s between two reads of the v2 cgroup dir's own files
// and holds each figure to them: the peak and the CPU (which only rise) within
// the two reads, current and the working set (current - inactive_file, which
// move both ways) within slack of them.
func besideKernelV2(t *testing.T, dir string, s source.Source, slack uint64) {
	t.Helper()
	k0 := kernelV2(t, dir)
	r, err := s.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	k1 := kernelV2(t, dir)
	t.Logf("beside the kernel: statsd %s; %s memory.current %d..%d, memory.peak %d..%d, current - inactive_file %d..%d, cpu.stat usage_usec %d..%d",
		fmtReading(r), dir, k0.Current, k1.Current, k0.Peak, k1.Peak, k0.WorkingSet, k1.WorkingSet, k0.CPUUsec, k1.CPUUsec)
	if r.MemoryPeakBytes == nil || r.CPUUsageUsec == nil {
		t.Fatalf("peak or CPU absent on v2: %+v", r.Absent)
	}
	for _, f := range []struct {
		name        string
		got, lo, hi uint64
		slack       uint64
	}{
		{"memory.current", r.MemoryCurrentBytes, k0.Current, k1.Current, slack},
		{"memory.peak", *r.MemoryPeakBytes, k0.Peak, k1.Peak, 0},
		{"working set (current - inactive_file)", r.MemoryWorkingSetBytes, k0.WorkingSet, k1.WorkingSet, slack},
		{"cpu.stat usage_usec", *r.CPUUsageUsec, k0.CPUUsec, k1.CPUUsec, 0},
	} {
		if f.got+f.slack < min(f.lo, f.hi) || f.got > max(f.lo, f.hi)+f.slack {
			t.Errorf("%s: statsd %d, the kernel's file %d before and %d after (slack %d)", f.name, f.got, f.lo, f.hi, f.slack)
		}
	}
}

// kernelFigures are a v2 cgroup's figures as its files say them.
type kernelFigures struct {
	Current, Peak, WorkingSet, CPUUsec uint64
}

// kernelV2 reads memory.current, memory.peak, memory.stat inactive_file and
// cpu.stat usage_usec of the v2 cgroup dir.
func kernelV2(t *testing.T, dir string) kernelFigures {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	one := func(name string) uint64 {
		v, err := parseSingleUint(read(name))
		if err != nil {
			t.Fatalf("%s/%s: %v", dir, name, err)
		}
		return v
	}
	keyed := func(name, key string) uint64 {
		v, ok, err := parseKeyed(read(name), key)
		if err != nil || !ok {
			t.Fatalf("%s/%s %s: %v", dir, name, key, err)
		}
		return v
	}
	k := kernelFigures{Current: one("memory.current"), Peak: one("memory.peak"), CPUUsec: keyed("cpu.stat", "usage_usec")}
	k.WorkingSet = k.Current - min(k.Current, keyed("memory.stat", "inactive_file"))
	return k
}

func fmtReading(r source.Reading) string {
	peak, procs := "absent", "absent"
	if r.MemoryPeakBytes != nil {
		peak = fmt.Sprintf("%.1f MiB", float64(*r.MemoryPeakBytes)/mib)
	}
	if r.SandboxProcesses != nil {
		procs = strconv.Itoa(int(*r.SandboxProcesses))
	}
	return fmt.Sprintf("current %.1f MiB, peak %s, working set %.1f MiB, cpu %d us, processes %s",
		float64(r.MemoryCurrentBytes)/mib, peak, float64(r.MemoryWorkingSetBytes)/mib, *r.CPUUsageUsec, procs)
}

package gvisor

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationGVisorSentryPID starts a real gVisor sandbox in a unique
// cgroup, opens the source by the sentry's pid (as statsd does for
// `--sentry-pid`), writes 200 MiB into the sandbox's /dev/shm with dd, and
// checks that:
//
//   - the source found the cgroup runsc made from linux.cgroupsPath;
//   - memory current rose by 200 MiB ± 10 % (tmpfs pages are the sentry's
//     memfd, charged to the sandbox cgroup);
//   - after rm, current falls back to within 20 MiB of idle while peak keeps
//     at least idle + 180 MiB;
//   - CPU rose;
//   - the sandbox has processes (sentry, gofer, ptrace stubs).
func TestIntegrationGVisorSentryPID(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox; not under -short")
	}
	sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: sb.PID}, Config{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	sample := func(what string) source.Reading {
		t.Helper()
		r, err := s.Sample(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%-10s %s", what+":", fmtReading(r))
		return r
	}

	r0 := sample("idle")
	t.Logf("detail: %s", r0.Detail)
	if !strings.Contains(r0.Detail, sb.CgroupPath) {
		t.Errorf("detail %q does not name the sandbox cgroup %s", r0.Detail, sb.CgroupPath)
	}
	if r0.SandboxProcesses == nil || *r0.SandboxProcesses < 2 {
		t.Errorf("sandbox processes = %v, want at least the sentry and the gofer", r0.SandboxProcesses)
	}

	start := time.Now()
	sb.Exec(t, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=200")
	t.Logf("dd of 200 MiB took %v", time.Since(start).Round(time.Millisecond))
	r1 := sample("filled")
	grew := int64(r1.MemoryCurrentBytes) - int64(r0.MemoryCurrentBytes)
	if !within(grew, 200*mib, 0.10) {
		t.Errorf("memory current rose by %.1f MiB after writing 200 MiB to /dev/shm, want 200 MiB ±10%%", float64(grew)/mib)
	}
	if *r1.CPUUsageUsec <= *r0.CPUUsageUsec {
		t.Errorf("cpu did not rise: %d -> %d us", *r0.CPUUsageUsec, *r1.CPUUsageUsec)
	}

	sb.Exec(t, "/bin/rm", "/dev/shm/fill")
	var r2 source.Reading
	deadline := time.Now().Add(20 * time.Second)
	for {
		r2 = sample("removed")
		if int64(r2.MemoryCurrentBytes)-int64(r0.MemoryCurrentBytes) < 20*mib || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if d := int64(r2.MemoryCurrentBytes) - int64(r0.MemoryCurrentBytes); d >= 20*mib {
		t.Errorf("memory current still %.1f MiB above idle 20 s after rm", float64(d)/mib)
	}
	if r2.MemoryPeakBytes == nil || int64(*r2.MemoryPeakBytes)-int64(r0.MemoryCurrentBytes) < 180*mib {
		t.Errorf("peak %v after rm, want at least idle + 180 MiB (kept)", r2.MemoryPeakBytes)
	}
	if *r2.CPUUsageUsec < *r1.CPUUsageUsec {
		t.Errorf("cpu went backwards: %d -> %d us", *r1.CPUUsageUsec, *r2.CPUUsageUsec)
	}
	if mode, err := detectMode(DefaultCgroupRoot); err == nil && mode == ModeUnified {
		// On v2 every figure is the kernel's own file, by sentry pid and by
		// cgroup path alike; the sentry's memory moves a little meanwhile.
		dir := filepath.Join(DefaultCgroupRoot, sb.CgroupPath)
		besideKernelV2(t, dir, s, 1<<20)
		byPath, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: sb.CgroupPath}, Config{Logger: discard()})
		if err != nil {
			t.Fatal(err)
		}
		defer byPath.Close()
		besideKernelV2(t, dir, byPath, 1<<20)
	}
	if out, err := sb.Runsc(t, "", "events", "--stats", sb.ID); err == nil {
		t.Logf("runsc events --stats (sentry accounting, for comparison): %s", strings.TrimSpace(string(out)))
	}
	t.Logf("figures: idle %.1f MiB, +%.1f MiB after dd, %.1f MiB after rm, peak %s, cpu +%d us",
		float64(r0.MemoryCurrentBytes)/mib, float64(grew)/mib, float64(r2.MemoryCurrentBytes)/mib,
		fmt.Sprintf("%.1f MiB", float64(*r2.MemoryPeakBytes)/mib), *r2.CPUUsageUsec-*r0.CPUUsageUsec)
}

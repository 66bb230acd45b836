package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// daemon is a real statsd built from ./cmd/statsd, serving on Unix sockets in
// a temporary directory, and the statsctl built beside it.
type daemon struct {
	bin, dir         string
	stats, lifecycle string
	cmd              *exec.Cmd
}

// buildBinaries builds ./cmd/statsd and ./cmd/statsctl into a temporary
// directory.
func buildBinaries(t testing.TB) string {
	t.Helper()
	bin := t.TempDir()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(gobin, "build", "-o", bin+"/",
		"github.com/sandboxstats/sandboxstats/cmd/statsd", "github.com/sandboxstats/sandboxstats/cmd/statsctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build statsd statsctl: %v\n%s", err, out)
	}
	return bin
}

func startStatsd(t testing.TB) *daemon {
	t.Helper()
	d := &daemon{bin: buildBinaries(t), dir: t.TempDir()}
	d.stats = filepath.Join(d.dir, "stats.sock")
	d.lifecycle = filepath.Join(d.dir, "lifecycle.sock")
	d.cmd = exec.Command(filepath.Join(d.bin, "statsd"),
		"--listen", d.stats, "--lifecycle-listen", d.lifecycle, "--state-dir", filepath.Join(d.dir, "state"),
		"--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc", "--read-timeout", "2s")
	logf, err := os.Create(filepath.Join(d.dir, "statsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(d.dir, "statsd.log"))
			t.Logf("statsd.log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, e1 := os.Stat(d.stats)
		_, e2 := os.Stat(d.lifecycle)
		if e1 == nil && e2 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("statsd did not create its sockets within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d
}

func (d *daemon) statsctl(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(filepath.Join(d.bin, "statsctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("statsctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// wireSample is the part of statsctl stats -o json (protojson of
// WorkloadStatsSample) the test checks; 64-bit integers are strings.
type wireSample struct {
	Source           string `json:"source"`
	SourceDetail     string `json:"source_detail"`
	MemoryCurrent    string `json:"memory_current_bytes"`
	MemoryPeak       string `json:"memory_peak_bytes"`
	CPUUsageUsec     string `json:"cpu_usage_usec"`
	SandboxProcesses *int   `json:"sandbox_processes"`
}

func (w wireSample) num(t testing.TB, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return v
}

// TestIntegrationGVisorThroughStatsd is the end-to-end test: a real
// gVisor sandbox bound to a real statsd through RunWorkload by sentry pid
// (statsctl run-workload --sentry-pid), sampled through StatsWorkload over a
// Unix socket (statsctl stats -o json) while 200 MiB are written to and
// removed from the sandbox's /dev/shm.
func TestIntegrationGVisorThroughStatsd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox and statsd; not under -short")
	}
	sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
	d := startStatsd(t)
	const actor = "e2e-gvisor-actor"
	d.statsctl(t, "run-workload", "--lifecycle-socket", d.lifecycle, "--actor-uid", actor,
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(sb.PID))
	sample := func(what string) wireSample {
		t.Helper()
		var w wireSample
		out := d.statsctl(t, "stats", "--socket", d.stats, "--actor-uid", actor, "-o", "json")
		if err := json.Unmarshal(out, &w); err != nil {
			t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
		}
		t.Logf("%-8s current %s, peak %s, cpu %s us, processes %v", what+":", w.MemoryCurrent, w.MemoryPeak, w.CPUUsageUsec, deref(w.SandboxProcesses))
		return w
	}
	w0 := sample("idle")
	if w0.Source != "STATS_SOURCE_CGROUP" || !strings.Contains(w0.SourceDetail, sb.CgroupPath) {
		t.Errorf("source %s %q, want the cgroup %s", w0.Source, w0.SourceDetail, sb.CgroupPath)
	}
	if w0.SandboxProcesses == nil || *w0.SandboxProcesses < 2 {
		t.Errorf("sandbox_processes = %v, want at least 2", deref(w0.SandboxProcesses))
	}
	sb.Exec(t, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=200")
	w1 := sample("filled")
	grew := w1.num(t, w1.MemoryCurrent) - w0.num(t, w0.MemoryCurrent)
	if !within(grew, 200*mib, 0.10) {
		t.Errorf("memory_current_bytes rose by %.1f MiB, want 200 MiB ±10%%", float64(grew)/mib)
	}
	if w1.num(t, w1.CPUUsageUsec) <= w0.num(t, w0.CPUUsageUsec) {
		t.Errorf("cpu_usage_usec did not rise: %s -> %s", w0.CPUUsageUsec, w1.CPUUsageUsec)
	}
	sb.Exec(t, "/bin/rm", "/dev/shm/fill")
	var w2 wireSample
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Second) {
		w2 = sample("removed")
		if w2.num(t, w2.MemoryCurrent)-w0.num(t, w0.MemoryCurrent) < 20*mib || time.Now().After(deadline) {
			break
		}
	}
	if d := w2.num(t, w2.MemoryCurrent) - w0.num(t, w0.MemoryCurrent); d >= 20*mib {
		t.Errorf("memory_current_bytes still %.1f MiB above idle after rm", float64(d)/mib)
	}
	if w2.MemoryPeak == "" || w2.num(t, w2.MemoryPeak)-w0.num(t, w0.MemoryCurrent) < 180*mib {
		t.Errorf("memory_peak_bytes %q after rm, want at least idle + 180 MiB", w2.MemoryPeak)
	}
	t.Logf("through statsd: +%.1f MiB after dd, peak %s, current back to %s", float64(grew)/mib, w2.MemoryPeak, w2.MemoryCurrent)
}

func deref(p *int) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

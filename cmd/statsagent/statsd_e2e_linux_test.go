package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// This file runs statsagent (the built binary) against real statsd
// processes (built from ./cmd/statsd) that measure real v1 cgroups holding a
// workload whose usage the test controls.

// TestWorkloadChild is not a test: it is the workload the end-to-end test
// moves into its cgroups (testenv.StartChild re-executes the test binary to
// run it; see testenv.RunChild for its commands).
func TestWorkloadChild(t *testing.T) { testenv.RunChild(t) }

// v1Cgroup makes the cgroup path rel in the v1 memory and cpuacct
// hierarchies and removes it at the end of the test (after the processes
// in it are gone: register it before starting them).
func v1Cgroup(t *testing.T, rel string) {
	t.Helper()
	for _, c := range []string{"memory", "cpuacct"} {
		dir := filepath.Join("/sys/fs/cgroup", c, rel)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			var err error
			for range 100 {
				if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Errorf("cleanup: rmdir %s: %v", dir, err)
		})
	}
}

func moveTo(t *testing.T, rel string, pid int) {
	t.Helper()
	for _, c := range []string{"memory", "cpuacct"} {
		p := filepath.Join("/sys/fs/cgroup", c, rel, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatalf("move %d to %s: %v", pid, p, err)
		}
	}
}

// realStatsd is a statsd process with its stats socket under dir/stats and
// its lifecycle socket under dir/lifecycle (so the agent's glob matches
// only stats sockets).
type realStatsd struct {
	name, stats, lifecycle, log string
	cmd                         *exec.Cmd
}

func startRealStatsd(t *testing.T, bin, dir, name string) *realStatsd {
	t.Helper()
	d := &realStatsd{
		name:      name,
		stats:     filepath.Join(dir, "stats", name+".sock"),
		lifecycle: filepath.Join(dir, "lifecycle", name+".sock"),
		log:       filepath.Join(dir, name+".log"),
	}
	d.cmd = exec.Command(filepath.Join(bin, "statsd"), "--listen", d.stats, "--lifecycle-listen", d.lifecycle,
		"--state-dir", filepath.Join(dir, "state-"+name), "--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc",
		"--read-timeout", "2s")
	logf, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGCONT) // in case it was stopped
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(d.log)
			t.Logf("%s:\n%s", d.log, b)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, e1 := os.Stat(d.stats)
		_, e2 := os.Stat(d.lifecycle)
		if e1 == nil && e2 == nil {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsd %s did not create its sockets within 10 s", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func statsctl(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "statsctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("statsctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// startAgentBinary runs the statsagent binary and returns its metrics URL.
func startAgentBinary(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	logPath := filepath.Join(dir, "statsagent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "statsagent"), append(args, "--metrics-listen", "127.0.0.1:0")...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("statsagent exited with %v after SIGTERM", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("statsagent did not stop within 10 s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("statsagent.log:\n%s", b)
		}
	})
	re := regexp.MustCompile(`msg="statsagent serving" addr=(\S+)`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(logPath)
		if m := re.FindSubmatch(b); m != nil {
			return "http://" + string(m[1])
		}
	}
	b, _ := os.ReadFile(logPath)
	t.Fatalf("statsagent did not start:\n%s", b)
	return ""
}

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return got >= want*(1-frac) && got <= want*(1+frac) }

// TestIntegrationRealStatsd is the end-to-end test with real parts:
// four statsd processes on Unix sockets (one measuring a workload in a real
// cgroup, one idle, one hung by SIGSTOP, one SIGKILLed mid-test) polled by
// the statsagent binary, its /metrics scraped over HTTP and parsed with the
// Prometheus text parser.
func TestIntegrationRealStatsd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs statsd and statsagent on real cgroups; not under -short")
	}
	testenv.Need(t, os.Geteuid() == 0, "needs root to create cgroups (run as root)")
	_, errM := os.Stat("/sys/fs/cgroup/memory/cgroup.procs")
	_, errC := os.Stat("/sys/fs/cgroup/cpuacct/cgroup.procs")
	testenv.Need(t, errM == nil && errC == nil, "needs the cgroup v1 memory and cpuacct hierarchies under /sys/fs/cgroup")

	bin := testenv.BuildBinaries(t, "statsagent")
	dir := t.TempDir()
	for _, sub := range []string{"stats", "lifecycle"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cgA := fmt.Sprintf("/statsagent-e2e-%d-a", os.Getpid())
	cgA2 := fmt.Sprintf("/statsagent-e2e-%d-a2", os.Getpid())
	v1Cgroup(t, cgA)
	v1Cgroup(t, cgA2)
	w := testenv.StartChild(t, "TestWorkloadChild") // after the cgroups: its cleanup (kill) runs before their rmdir
	moveTo(t, cgA, w.Cmd.Process.Pid)

	dA := startRealStatsd(t, bin, dir, "a")
	dB := startRealStatsd(t, bin, dir, "b")
	dH := startRealStatsd(t, bin, dir, "h")
	dK := startRealStatsd(t, bin, dir, "k")
	_ = dB // idle: no workload bound
	bind := func(d *realStatsd, op, actor, cg string) {
		statsctl(t, bin, op, "--lifecycle-socket", d.lifecycle, "--actor-uid", actor, "--actor-name", actor,
			"--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", "py",
			"--class", "gvisor", "--cgroup-path", cg)
	}
	bind(dA, "run-workload", "e2e-a", cgA)
	bind(dK, "run-workload", "e2e-k", cgA) // same cgroup, another daemon: killed later
	bind(dH, "run-workload", "e2e-h", cgA)
	if err := dH.cmd.Process.Signal(syscall.SIGSTOP); err != nil { // hung: accepts, never answers
		t.Fatal(err)
	}
	w.Do(t, "alloc 64")

	const timeout = time.Second
	base := startAgentBinary(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", "1500ms", "--min-interval", "100ms", "--timeout", timeout.String(), "--label-actor", "--grace", "1m")
	lA := series("e2e-a", "gvisor", "cgroup")
	lK := series("e2e-k", "gvisor", "cgroup")

	// Memory matches what statsd itself answers.
	m := waitSweeps(t, base, 2)
	var js struct {
		MemoryCurrent string `json:"memory_current_bytes"`
	}
	out := statsctl(t, bin, "stats", "--socket", dA.stats, "--actor-uid", "e2e-a", "-o", "json")
	if err := json.Unmarshal(out, &js); err != nil {
		t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
	}
	direct, _ := strconv.ParseFloat(js.MemoryCurrent, 64)
	exported := m["sandboxstats_workload_memory_current_bytes"+lA]
	t.Logf("memory current: exported %.1f MiB, statsctl %.1f MiB", exported/(1<<20), direct/(1<<20))
	if !within(exported, direct, 0.05) || exported < 64<<20 {
		t.Errorf("exported memory current %.0f, statsd answers %.0f (and the workload holds 64 MiB)", exported, direct)
	}
	for _, k := range []string{"sandboxstats_agent_daemons{result=ok}", "sandboxstats_agent_daemons{result=no-sample}", "sandboxstats_agent_daemons{result=error}"} {
		wantN := map[string]float64{"sandboxstats_agent_daemons{result=ok}": 2, "sandboxstats_agent_daemons{result=no-sample}": 1, "sandboxstats_agent_daemons{result=error}": 1}[k]
		if m[k] != wantN {
			t.Errorf("%s = %v, want %v", k, m[k], wantN)
		}
	}
	if m["sandboxstats_agent_poll_errors_total{code=DeadlineExceeded}"] < 1 {
		t.Errorf("no DeadlineExceeded poll error for the stopped daemon")
	}
	// The hung daemon costs one timeout, not one per daemon.
	if d := m["sandboxstats_agent_last_sweep_duration_seconds{}"]; d < timeout.Seconds() || d > 1.8*timeout.Seconds() {
		t.Errorf("sweep took %.3f s, want about one timeout (%v)", d, timeout)
	}
	t.Logf("sweep with one hung daemon: %.3f s (timeout %v)", m["sandboxstats_agent_last_sweep_duration_seconds{}"], timeout)

	// CPU: the workload burns a known 600 ms.
	c0 := m["sandboxstats_workload_cpu_seconds_total"+lA]
	ans := w.Do(t, "burn 600")
	m = waitNewSweeps(t, base)
	c1 := m["sandboxstats_workload_cpu_seconds_total"+lA]
	t.Logf("burn 600 ms (%s): counter %.3f -> %.3f s", ans, c0, c1)
	if !within(c1-c0, 0.6, 0.25) {
		t.Errorf("CPU counter rose by %.3f s, want 0.6 s ±25%%", c1-c0)
	}

	// Kill one daemon (SIGKILL leaves its socket): its workload leaves the
	// gauges, its poll fails UNAVAILABLE, the others are unaffected.
	if err := dK.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	m = waitNewSweeps(t, base)
	if _, ok := m["sandboxstats_workload_memory_current_bytes"+lK]; ok {
		t.Errorf("killed daemon's workload still exported")
	}
	if m["sandboxstats_agent_poll_errors_total{code=Unavailable}"] < 1 {
		t.Errorf("no Unavailable poll error after the kill")
	}
	if _, ok := m["sandboxstats_workload_memory_current_bytes"+lA]; !ok {
		t.Errorf("live workload lost after the kill")
	}

	// Restore into a fresh cgroup (new epoch, counter from 0), burn 300 ms:
	// the new epoch's counter is charged in full, nothing decreases.
	moveTo(t, cgA2, w.Cmd.Process.Pid)
	statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", dA.lifecycle, "--actor-uid", "e2e-a")
	bind(dA, "restore-workload", "e2e-a", cgA2)
	ans = w.Do(t, "burn 300")
	m = waitNewSweeps(t, base)
	c2 := m["sandboxstats_workload_cpu_seconds_total"+lA]
	t.Logf("restore + burn 300 ms (%s): counter %.3f -> %.3f s", ans, c1, c2)
	if c2 < c1 {
		t.Fatalf("CPU counter decreased across the epoch reset: %.3f -> %.3f", c1, c2)
	}
	if !within(c2-c1, 0.3, 0.35) {
		t.Errorf("CPU counter rose by %.3f s across the restore, want 0.3 s ±35%%", c2-c1)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// fleetDir is a node's socket directory as statsagent's glob sees it: a
// stats/ and a lifecycle/ directory for startStatsdIn's daemons.
func fleetDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"stats", "lifecycle"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startStatsdIn starts a statsd whose stats socket is dir/stats/name.sock
// and lifecycle socket dir/lifecycle/name.sock, so that an agent's glob of
// dir/stats/*.sock matches the stats sockets only.
func startStatsdIn(t *testing.T, bin, dir, name string, args ...string) *testenv.Statsd {
	t.Helper()
	return testenv.StartStatsdAt(t, bin, filepath.Join(dir, "stats", name+".sock"), filepath.Join(dir, "lifecycle", name+".sock"),
		filepath.Join(dir, "state-"+name), args...)
}

// TestIntegrationRealStatsd is the end-to-end test with real parts:
// four statsd processes on Unix sockets (one measuring a workload in a real
// cgroup, one idle, one hung by SIGSTOP, one SIGKILLed mid-test) polled by
// the statsagent binary, its /metrics scraped over HTTP and parsed with the
// Prometheus text parser.
func TestIntegrationRealStatsd(t *testing.T) {
	needCgroups(t)

	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	cgA := fmt.Sprintf("/statsagent-e2e-%d-a", os.Getpid())
	cgA2 := fmt.Sprintf("/statsagent-e2e-%d-a2", os.Getpid())
	testCgroup(t, cgA)
	testCgroup(t, cgA2)
	w := testenv.StartChild(t, "TestWorkloadChild") // after the cgroups: its cleanup (kill) runs before their rmdir
	moveTo(t, cgA, w.Cmd.Process.Pid)

	dA := startStatsdIn(t, bin, dir, "a")
	dB := startStatsdIn(t, bin, dir, "b")
	dH := startStatsdIn(t, bin, dir, "h")
	dK := startStatsdIn(t, bin, dir, "k")
	_ = dB // idle: no workload bound
	bind := func(d *testenv.Statsd, op, actor, cg string) {
		statsctl(t, bin, op, "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--actor-name", actor,
			"--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", "py",
			"--class", "gvisor", "--cgroup-path", cg)
	}
	bind(dA, "run-workload", "e2e-a", cgA)
	bind(dK, "run-workload", "e2e-k", cgA) // same cgroup, another daemon: killed later
	bind(dH, "run-workload", "e2e-h", cgA)
	if err := dH.Cmd.Process.Signal(syscall.SIGSTOP); err != nil { // hung: accepts, never answers
		t.Fatal(err)
	}
	w.Do(t, "alloc 64")

	const timeout = time.Second
	base := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", "1500ms", "--min-interval", "100ms", "--timeout", timeout.String(), "--label-actor", "--grace", "1m")
	lA := series("e2e-a", "gvisor", "cgroup")
	lK := series("e2e-k", "gvisor", "cgroup")

	// Memory matches what statsd itself answers.
	m := testenv.WaitSweeps(t, base, 2)
	var js struct {
		MemoryCurrent string `json:"memory_current_bytes"`
	}
	out := statsctl(t, bin, "stats", "--socket", dA.Stats, "--actor-uid", "e2e-a", "-o", "json")
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
	m = testenv.WaitNewSweeps(t, base)
	c1 := m["sandboxstats_workload_cpu_seconds_total"+lA]
	t.Logf("burn 600 ms (%s): counter %.3f -> %.3f s", ans, c0, c1)
	if !within(c1-c0, 0.6, 0.25) {
		t.Errorf("CPU counter rose by %.3f s, want 0.6 s ±25%%", c1-c0)
	}

	// Kill one daemon (SIGKILL leaves its socket): its workload leaves the
	// gauges, its poll fails UNAVAILABLE, the others are unaffected.
	if err := dK.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	m = testenv.WaitNewSweeps(t, base)
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
	statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", dA.Lifecycle, "--actor-uid", "e2e-a")
	bind(dA, "restore-workload", "e2e-a", cgA2)
	ans = w.Do(t, "burn 300")
	m = testenv.WaitNewSweeps(t, base)
	c2 := m["sandboxstats_workload_cpu_seconds_total"+lA]
	t.Logf("restore + burn 300 ms (%s): counter %.3f -> %.3f s", ans, c1, c2)
	if c2 < c1 {
		t.Fatalf("CPU counter decreased across the epoch reset: %.3f -> %.3f", c1, c2)
	}
	if !within(c2-c1, 0.3, 0.35) {
		t.Errorf("CPU counter rose by %.3f s across the restore, want 0.3 s ±35%%", c2-c1)
	}
}

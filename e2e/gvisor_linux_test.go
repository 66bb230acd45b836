package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

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
	bin := testenv.BuildBinaries(t)
	d := testenv.StartStatsd(t, bin)
	const actor = "e2e-gvisor-actor"
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor,
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(sb.PID))
	sample := func(what string) wireSample {
		t.Helper()
		var w wireSample
		out := statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", actor, "-o", "json")
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
	if !within(float64(grew), 200*mib, 0.10) {
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

// TestIntegrationGVisorOOMKilled: a real gVisor sandbox whose OCI spec sets
// a 64 MiB memory limit writes 200 MiB to its /dev/shm and is OOM-killed by
// the host kernel: through statsd the sample shows the limit and the kill,
// and the Checkpoint's record says the activation was OOM-killed; the node
// agent counts it by outcome.
func TestIntegrationGVisorOOMKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox and statsd; not under -short")
	}
	sb := testenv.StartSandboxWith(t, testenv.SandboxOptions{MemoryLimit: 64 << 20}, "/bin/sh", "-c", "while true; do sleep 1; done")
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	d := startStatsdIn(t, bin, dir, "oom")
	agentURL := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"), "--interval", "1s", "--min-interval", "100ms", "--timeout", "5s")
	const actor = "e2e-oom"
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--template-namespace", "tmpl", "--template-name", "py",
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(sb.PID))
	// The agent samples the sandbox alive before the kill: this is the
	// polled-before-death case (TestIntegrationGVisorOOMKilledBeforeAnyPoll
	// is the other).
	testenv.WaitNewSweeps(t, agentURL)
	out, err := sb.Runsc(t, "", "exec", sb.ID, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=200")
	t.Logf("dd of 200 MiB under a 64 MiB limit: %v %s", err, strings.TrimSpace(string(out)))
	var s struct {
		MemorySignals struct {
			LimitBytes struct {
				Value string `json:"value"`
			} `json:"limit_bytes"`
			OOMKills string `json:"oom_kills"`
		} `json:"memory_signals"`
		SandboxProcesses *int `json:"sandbox_processes"`
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := json.Unmarshal(statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", actor, "-o", "json"), &s); err != nil {
			t.Fatal(err)
		}
		if s.MemorySignals.OOMKills != "" && s.MemorySignals.OOMKills != "0" {
			break
		}
	}
	if s.MemorySignals.LimitBytes.Value != "67108864" || s.MemorySignals.OOMKills == "" || s.MemorySignals.OOMKills == "0" {
		t.Fatalf("sample: limit %q, oom kills %q; want 64 MiB and at least one kill", s.MemorySignals.LimitBytes.Value, s.MemorySignals.OOMKills)
	}
	ck := string(statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor))
	t.Logf("sample: limit %s bytes, %s OOM kill(s), processes %s; checkpoint:\n%s", s.MemorySignals.LimitBytes.Value, s.MemorySignals.OOMKills, deref(s.SandboxProcesses), ck)
	if !strings.Contains(ck, "oom-killed") {
		t.Errorf("the record's outcome is not oom-killed:\n%s", ck)
	}
	testenv.WaitNewSweeps(t, agentURL)
	m := testenv.WaitNewSweeps(t, agentURL)
	if got := m["sandboxstats_activations_ended_total{outcome=oom-killed,sandbox_class=gvisor,source=cgroup,template_name=py,template_namespace=tmpl}"]; got != 1 {
		t.Errorf("agent counted %v OOM-killed activations, want 1", got)
	}
}

// oomKillUnpolled starts a gVisor sandbox with a 64 MiB OCI memory limit and
// a statsd (nothing polls it), binds the sandbox by sentry pid, writes 200
// MiB in it and waits, without asking statsd, until the host's OOM killer
// has taken the sentry (the pin tells a reused pid apart; a zombie is dead).
func oomKillUnpolled(t *testing.T, name string) (sb *testenv.Sandbox, bin string, d *testenv.Statsd, actor string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox and statsd; not under -short")
	}
	sb = testenv.StartSandboxWith(t, testenv.SandboxOptions{MemoryLimit: 64 << 20}, "/bin/sh", "-c", "while true; do sleep 1; done")
	sentry, err := process.NewTracker("/proc").Check(sb.PID)
	if err != nil {
		t.Fatal(err)
	}
	bin = testenv.BuildBinaries(t)
	d = startStatsdIn(t, bin, fleetDir(t), name)
	actor = "e2e-" + name
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--template-namespace", "tmpl", "--template-name", "py",
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(sb.PID))
	out, err := sb.Runsc(t, "", "exec", sb.ID, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=200")
	t.Logf("dd of 200 MiB under a 64 MiB limit: %v %s", err, strings.TrimSpace(string(out)))
	start := time.Now()
	for deadline := start.Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		running, err := sentry.Running("/proc")
		if err != nil {
			t.Fatal(err)
		}
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the dd of 200 MiB under a 64 MiB limit: sentry pid %d still running", sb.PID)
		}
	}
	t.Logf("sentry dead %v after the dd returned", time.Since(start).Round(time.Millisecond))
	return sb, bin, d, actor
}

// checkpointOutcome checkpoints actor and returns the record's OUTCOME.
func checkpointOutcome(t *testing.T, bin string, d *testenv.Statsd, actor string) string {
	t.Helper()
	ck := string(statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor))
	t.Logf("checkpoint:\n%s", ck)
	for _, l := range strings.Split(ck, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "OUTCOME" {
			return f[1]
		}
	}
	return ""
}

// TestIntegrationGVisorSentryDiedProcessesLeft: a sandbox bound by sentry
// pid whose sentry the OOM killer took is dead even while its cgroup still
// holds a process (a gofer on its way out; here a process the test parks
// there): the record says oom-killed, not checkpointed. It failed before
// the source said that its pinned sentry had exited.
func TestIntegrationGVisorSentryDiedProcessesLeft(t *testing.T) {
	sb, bin, d, actor := oomKillUnpolled(t, "oom-left")
	c := testenv.StartChild(t, "TestWorkloadChild")
	sb.Join(t, c.Cmd.Process.Pid)
	t.Logf("processes left in the sandbox's cgroup: %v", sb.Processes(t))
	if got := checkpointOutcome(t, bin, d, actor); got != "oom-killed" {
		t.Errorf("the record's outcome is %q, want oom-killed (the sentry is dead)", got)
	}
}

// TestIntegrationGVisorOOMKilledBeforeAnyPoll is issue 20, "the early
// death": as TestIntegrationGVisorOOMKilled, but nothing reads statsd between
// the bind by sentry pid and the OOM kill that takes the sentry, so no Sample
// ever saw the sentry alive. The source found the sentry's cgroup at the bind
// (gvisor.Open), so the Checkpoint's final read still finds the cgroup it
// left, with the kill: the record says oom-killed and its final sample
// counts the kill.
func TestIntegrationGVisorOOMKilledBeforeAnyPoll(t *testing.T) {
	sb, bin, d, actor := oomKillUnpolled(t, "oom-early")
	// The gofer outlives the sentry a little: wait for the cgroup to empty
	// too, so that this test holds the dead-sandbox path of the outcome.
	for deadline := time.Now().Add(20 * time.Second); len(sb.Processes(t)) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the sentry died: processes in the sandbox's cgroup %v", sb.Processes(t))
		}
	}
	if outcome := checkpointOutcome(t, bin, d, actor); outcome != "oom-killed" {
		t.Errorf("the record's outcome is %q, want oom-killed", outcome)
	}
	var list struct {
		Ended []struct {
			Outcome         string `json:"outcome"`
			FinalProvenance string `json:"final_provenance"`
			Final           struct {
				MemorySignals struct {
					OOMKills   string `json:"oom_kills"`
					LimitBytes struct {
						Value string `json:"value"`
					} `json:"limit_bytes"`
				} `json:"memory_signals"`
				SandboxProcesses *int `json:"sandbox_processes"`
			} `json:"final"`
		} `json:"ended"`
	}
	if b := statsctl(t, bin, "activations", "--socket", d.Stats, "-o", "json"); json.Unmarshal(b, &list) != nil || len(list.Ended) != 1 {
		t.Fatalf("statsctl activations -o json: want one ended activation:\n%s", b)
	}
	e := list.Ended[0]
	t.Logf("ended: %s, final %s: %q OOM kill(s), processes %s", e.Outcome, e.FinalProvenance, e.Final.MemorySignals.OOMKills, deref(e.Final.SandboxProcesses))
	if e.Outcome != "ACTIVATION_OUTCOME_OOM_KILLED" || e.FinalProvenance != "FINAL_PROVENANCE_READ_AT_END" {
		t.Errorf("ended activation: outcome %s, final %s; want ACTIVATION_OUTCOME_OOM_KILLED, FINAL_PROVENANCE_READ_AT_END", e.Outcome, e.FinalProvenance)
	}
	// The kernel's own count, in the cgroup the dead sandbox left.
	var raw uint64
	if testenv.CgroupV2() {
		raw = testenv.CgroupUint(t, filepath.Join("/sys/fs/cgroup", sb.CgroupPath), "memory.events", "oom_kill")
	} else {
		raw = testenv.CgroupUint(t, filepath.Join("/sys/fs/cgroup", "memory", sb.CgroupPath), "memory.oom_control", "oom_kill")
	}
	t.Logf("final: limit %s bytes, oom_kills %s; the kernel's oom_kill %d", e.Final.MemorySignals.LimitBytes.Value, e.Final.MemorySignals.OOMKills, raw)
	if k, err := strconv.ParseUint(e.Final.MemorySignals.OOMKills, 10, 64); err != nil || k < 1 || k != raw {
		t.Errorf("final sample: oom_kills %q, want at least 1 and the kernel's %d", e.Final.MemorySignals.OOMKills, raw)
	}
	if e.Final.MemorySignals.LimitBytes.Value != "67108864" {
		t.Errorf("final sample: limit %q, want the OCI spec's 64 MiB", e.Final.MemorySignals.LimitBytes.Value)
	}
}

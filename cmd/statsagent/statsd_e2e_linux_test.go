package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// This file runs statsagent (the built binary) against real statsd
// processes (built from ./cmd/statsd) that measure real v1 cgroups holding a
// workload whose usage the test controls.

// need skips the test when a prerequisite is missing, or fails it when
// CI=true (CI must not silently skip an end-to-end test).
func need(t testing.TB, ok bool, hint string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing (CI=true): %s", hint)
	}
	t.Skip(hint)
}

const childEnv = "STATSAGENT_E2E_CHILD"

// TestWorkloadChild is not a test: it is the workload the end-to-end test
// moves into its cgroups (the test binary re-executed with childEnv). One
// command per stdin line, one answer line:
//
//	alloc <MiB>  allocate and touch that much memory -> "ok"
//	burn <ms>    spin until this process used <ms> more CPU -> "ok <usec used>"
func TestWorkloadChild(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper process for TestIntegrationRealStatsd")
	}
	var hold [][]byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		n, _ := strconv.Atoi(arg)
		switch cmd {
		case "alloc":
			b := make([]byte, n<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			hold = append(hold, b)
			fmt.Println("ok")
		case "burn":
			start := selfCPUUsec()
			x := 0
			for selfCPUUsec()-start < int64(n)*1000 {
				for i := range 100000 {
					x += i
				}
			}
			fmt.Println("ok", selfCPUUsec()-start, x%2)
		default:
			fmt.Println("unknown command", cmd)
		}
	}
	os.Exit(0)
}

func selfCPUUsec() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Sec*1e6 + ru.Utime.Usec + ru.Stime.Sec*1e6 + ru.Stime.Usec
}

type workloadChild struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

func startWorkload(t *testing.T) *workloadChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkloadChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	c := &workloadChild{cmd: cmd, in: inW, out: bufio.NewScanner(outR)}
	t.Cleanup(func() {
		c.in.Close()
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		outR.Close()
	})
	return c
}

func (c *workloadChild) do(t *testing.T, line string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatalf("workload %q: %v", line, err)
	}
	if !c.out.Scan() {
		t.Fatalf("workload %q: no answer: %v", line, c.out.Err())
	}
	ans := c.out.Text()
	if !strings.HasPrefix(ans, "ok") {
		t.Fatalf("workload %q: %q", line, ans)
	}
	return ans
}

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

// buildBinaries builds statsd, statsctl and statsagent into a temporary
// directory.
func buildBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin+"/",
		"github.com/sandboxstats/sandboxstats/cmd/statsd",
		"github.com/sandboxstats/sandboxstats/cmd/statsctl",
		"github.com/sandboxstats/sandboxstats/cmd/statsagent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
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
	need(t, os.Geteuid() == 0, "needs root to create cgroups (run as root)")
	_, errM := os.Stat("/sys/fs/cgroup/memory/cgroup.procs")
	_, errC := os.Stat("/sys/fs/cgroup/cpuacct/cgroup.procs")
	need(t, errM == nil && errC == nil, "needs the cgroup v1 memory and cpuacct hierarchies under /sys/fs/cgroup")

	bin := buildBinaries(t)
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
	w := startWorkload(t) // after the cgroups: its cleanup (kill) runs before their rmdir
	moveTo(t, cgA, w.cmd.Process.Pid)

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
	w.do(t, "alloc 64")

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
	ans := w.do(t, "burn 600")
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
	moveTo(t, cgA2, w.cmd.Process.Pid)
	statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", dA.lifecycle, "--actor-uid", "e2e-a")
	bind(dA, "restore-workload", "e2e-a", cgA2)
	ans = w.do(t, "burn 300")
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

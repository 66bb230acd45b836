package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// signalCgroup makes the cgroup rel in the v1 memory, cpuacct, cpu, blkio
// and pids hierarchies (removed at the end of the test, after the processes
// registered later) and returns the directories by hierarchy.
func signalCgroup(t *testing.T, rel string) map[string]string {
	t.Helper()
	dirs := map[string]string{}
	for _, c := range []string{"memory", "cpuacct", "cpu", "blkio", "pids"} {
		_, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "cgroup.procs"))
		testenv.Need(t, err == nil, "needs the cgroup v1 "+c+" hierarchy under /sys/fs/cgroup")
		dirs[c] = filepath.Join("/sys/fs/cgroup", c, rel)
		if err := os.MkdirAll(dirs[c], 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := testenv.RmdirRetry(dirs[c]); err != nil {
				t.Errorf("remove cgroup %s: %v", dirs[c], err)
			}
		})
	}
	return dirs
}

func joinAll(t *testing.T, dirs map[string]string, pid int) {
	t.Helper()
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatalf("move %d into %s: %v", pid, d, err)
		}
	}
}

// cgroupKey returns key's value in a flat keyed cgroup file.
func cgroupKey(t *testing.T, file, key string) uint64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == key {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s in %s", key, file)
	return 0
}

// promValue returns the value of query's only sample, waiting up to 15 s
// for want(value) to hold (Prometheus scrapes on its own schedule); it
// returns the last value seen and whether there was one.
func promValue(t *testing.T, p *testenv.Prometheus, query string, want func(float64) bool) (float64, bool) {
	t.Helper()
	var v float64
	var ok bool
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		res := p.Query(t, query)
		if ok = len(res) == 1; ok {
			v = res[0].Value
			if want(v) {
				return v, true
			}
		}
	}
	return v, ok
}

// TestIntegrationSignalsPrometheus: the signals and traffic of a real v1
// cgroup, polled by the statsagent binary and scraped by a real Prometheus.
// The cgroup has a 64 MiB memory limit and a 20 ms / 100 ms CFS quota: a
// child burns 500 ms of CPU under the quota (throttled), a 64 MiB O_DIRECT
// write goes to /var/tmp from inside it, and a child allocating 200 MiB is
// OOM-killed. PromQL then answers one OOM kill, the throttled seconds within
// 20 % of the cgroup's own throttled_time, a 64 MiB memory limit, and the
// 64 MiB written ± 10 % when the kernel counts that disk (else no IO series
// at all: absent, not 0); promtool check metrics is clean on the live scrape.
func TestIntegrationSignalsPrometheus(t *testing.T) {
	needV1(t)
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := t.TempDir()
	for _, sub := range []string{"stats", "lifecycle"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg := fmt.Sprintf("/statsagent-signals-%d", os.Getpid())
	dirs := signalCgroup(t, cg)
	if err := os.WriteFile(filepath.Join(dirs["memory"], "memory.limit_in_bytes"), []byte(strconv.Itoa(64<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dirs["memory"], "memory.swappiness"), []byte("0"), 0o644) // the allocation cannot escape to swap
	if err := os.WriteFile(filepath.Join(dirs["cpu"], "cpu.cfs_quota_us"), []byte("20000"), 0o644); err != nil {
		t.Fatal(err)
	}
	burner := testenv.StartChild(t, "TestWorkloadChild") // after the cgroups: killed before their removal
	hog := testenv.StartChild(t, "TestWorkloadChild")

	d := startStatsdIn(t, bin, dir, "sig")
	agentURL := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", "500ms", "--min-interval", "100ms", "--timeout", "2s", "--label-actor", "--grace", "5m")
	u, _ := url.Parse(agentURL)
	prom := testenv.StartPrometheus(t, []string{u.Host}, 500*time.Millisecond)
	// Bound after the agent started: the activation's head is charged.
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "sig", "--actor-name", "sig",
		"--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", "py", "--class", "gvisor", "--cgroup-path", cg)
	joinAll(t, dirs, burner.Cmd.Process.Pid)
	testenv.WaitNewSweeps(t, agentURL)

	start := time.Now()
	burner.Do(t, "burn 500")
	t.Logf("500 ms of CPU under 20 ms/100 ms took %v", time.Since(start).Round(time.Millisecond))
	burner.Kill()

	// 64 MiB written with O_DIRECT from inside the cgroup.
	ioDir, err := os.MkdirTemp("/var/tmp", "statsagent-signals-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ioDir) })
	script := ""
	for _, dd := range dirs {
		script += "echo $$ > " + filepath.Join(dd, "cgroup.procs") + " && "
	}
	script += "dd if=/dev/zero of=" + filepath.Join(ioDir, "f") + " bs=1M count=64 oflag=direct 2>&1 | tail -1"
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil || !strings.Contains(string(out), "copied") {
		t.Fatalf("dd: %v: %s", err, out)
	}

	joinAll(t, dirs, hog.Cmd.Process.Pid)
	hog.Send(t, "alloc 200")
	state, _ := hog.Wait()
	t.Logf("a child allocating 200 MiB under the 64 MiB limit: %v", state)

	throttledTruth := float64(cgroupKey(t, filepath.Join(dirs["cpu"], "cpu.stat"), "throttled_time")) / 1e9
	oomTruth := cgroupKey(t, filepath.Join(dirs["memory"], "memory.oom_control"), "oom_kill")
	var js struct {
		BlockIO *struct {
			WriteBytes string `json:"write_bytes"`
			Origin     string `json:"origin"`
		} `json:"block_io"`
		Absent []struct{ Field, Reason string } `json:"absent"`
	}
	out := statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", "sig", "-o", "json")
	if err := json.Unmarshal(out, &js); err != nil {
		t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
	}
	t.Logf("cgroup truth: throttled_time %.3f s, oom_kill %d", throttledTruth, oomTruth)
	testenv.WaitNewSweeps(t, agentURL)

	sel := `{actor_uid="sig"}`
	if v, _ := promValue(t, prom, "sandboxstats_workload_oom_kills_total"+sel, func(v float64) bool { return v == 1 }); v != 1 || oomTruth != 1 {
		t.Errorf("PromQL oom_kills_total = %v (cgroup oom_kill %d), want 1", v, oomTruth)
	}
	v, _ := promValue(t, prom, "sandboxstats_workload_cpu_throttled_seconds_total"+sel, func(v float64) bool { return within(v, throttledTruth, 0.20) })
	t.Logf("PromQL cpu_throttled_seconds_total = %.3f s, the cgroup's throttled_time %.3f s", v, throttledTruth)
	// 500 ms of CPU at 20 ms per 100 ms is throttled about 2 s on an idle
	// runner; on a loaded one the loop also waits for a CPU (not
	// throttling), so only "clearly throttled" is asserted of the truth.
	if throttledTruth < 0.3 || !within(v, throttledTruth, 0.20) {
		t.Errorf("throttled seconds %.3f, want the cgroup's %.3f ± 20%% (and at least 0.3 s under the quota)", v, throttledTruth)
	}
	if v, _ := promValue(t, prom, "sandboxstats_workload_memory_limit_bytes"+sel, func(v float64) bool { return v == 64<<20 }); v != 64<<20 {
		t.Errorf("PromQL memory_limit_bytes = %v, want 64 MiB", v)
	}
	for _, q := range []string{"sandboxstats_workload_cpu_throttled_periods_total", "sandboxstats_workload_cpu_periods_total", "sandboxstats_workload_pids"} {
		if v, ok := promValue(t, prom, q+sel, func(float64) bool { return true }); !ok {
			t.Errorf("PromQL %s: no series", q)
		} else {
			t.Logf("PromQL %s = %v", q, v)
		}
	}
	if js.BlockIO != nil {
		v, _ := promValue(t, prom, "sandboxstats_workload_io_write_bytes_total"+sel, func(v float64) bool { return within(v, 64<<20, 0.10) })
		t.Logf("disk counted (%s): PromQL io_write_bytes_total = %.1f MiB", js.BlockIO.Origin, v/(1<<20))
		if !within(v, 64<<20, 0.10) {
			t.Errorf("io_write_bytes_total = %.1f MiB, want 64 MiB ± 10%%", v/(1<<20))
		}
	} else {
		if res := prom.Query(t, "sandboxstats_workload_io_write_bytes_total"+sel); len(res) != 0 {
			t.Errorf("block IO absent from the sample %v, yet a series: %v", js.Absent, res)
		}
		t.Logf("disk not counted by the kernel: no IO series (absent: %v)", js.Absent)
	}

	resp, err := http.Get(agentURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if lint := testenv.PromtoolCheckMetrics(t, body); lint != "" {
		t.Errorf("promtool check metrics on the live scrape:\n%s", lint)
	}
}

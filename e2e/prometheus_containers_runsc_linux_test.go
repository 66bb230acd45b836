package e2e

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationPrometheusContainerRuleRunsc is
// TestIntegrationPrometheusContainerRule over a real runsc pod (pause,
// busy burning a shell loop without end, idle sleeping) bound to the
// statsd binary with --runsc-root by its sentry pid, its cgroup's CPU
// capped at 0.3 cores (a v1 host: cpu.cfs_quota_us). The truth is statsd's
// own: the busy container's cpu_usage_usec in StatsWorkload samples at the
// window's ends (whatever split of the sandbox's CPU statsd makes, the
// export must carry it unchanged). The rule's expression with rate over the
// window, evaluated a sweep after its end, equals it within 5%; irate's
// values (the rule itself) are logged: a real burner's second-to-second CPU
// under ptrace on a shared machine varies more than 5%.
func TestIntegrationPrometheusContainerRuleRunsc(t *testing.T) {
	needV1(t)
	testenv.NeedPrometheus(t)
	p := testenv.StartRunscPod(t, []string{"busy", "idle"}, map[string][]string{
		"busy": {"sh", "-c", "while :; do :; done"},
		"idle": {"sleep", "100000"},
	})
	// The sandbox's cgroup capped at 0.3 cores: the burner's pace then
	// holds from second to second on a shared machine, so a sweep's lag
	// behind a scrape (up to 1 s at each end of the window) moves the
	// rate little.
	quota := filepath.Join(testenv.CgroupRoot, "cpu", p.CgroupParent, "pause", "cpu.cfs_quota_us")
	if err := os.WriteFile(quota, []byte("30000"), 0o644); err != nil {
		t.Fatalf("cap the sandbox's CPU: %v", err)
	}
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	const namespace, pod, actor = "team", "gvisor-pod", "gvisor-pod-uid"
	d := startStatsdIn(t, bin, dir, "gvisor", "--runsc-root", p.Root)
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--actor-name", pod,
		"--actor-namespace", namespace, "--template-namespace", "tmpl", "--template-name", "py",
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(p.SentryPID(t)))
	stats, _ := clients(t, d)
	busyCPU := func() (time.Time, float64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		at := time.Now()
		r, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: actor})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range r.GetSample().GetContainers() {
			if c.GetName() == "busy" && c.CpuUsageUsec != nil {
				return at, float64(c.GetCpuUsageUsec()) / 1e6
			}
		}
		t.Fatalf("no CPU for busy in %v", r.GetSample())
		return at, 0
	}
	// busy, idle and POD (the sandbox's own share: the sentry, the gofers,
	// the pause container).
	prom := startRuleStack(t, bin, dir, namespace, pod, 3)

	const window = 10 * time.Second
	t1, c1 := busyCPU()
	time.Sleep(window)
	t2, c2 := busyCPU()
	truth := (c2 - c1) / t2.Sub(t1).Seconds()
	time.Sleep(2 * time.Second) // a sweep after t2, scraped
	// The sweeps the scrapes carry are up to a sweep (1 s) older than
	// the scrape: the window that matches the samples' ends at t2 + 1 s.
	at := t2.Add(time.Second)
	rate := byContainer(prom.QueryAt(t, rateRule(t, t2.Sub(t1).Round(time.Second)), at))
	irate := byContainer(prom.QueryAt(t, cpuRule, at))
	t.Logf("busy: statsd's samples %.4f cores over %v; the rule's expression with rate over the window %.4f (%.1f%% off), the rule (irate) %.4f; idle: rate %.4f, irate %.4f",
		truth, t2.Sub(t1).Round(time.Millisecond), rate["busy"], 100*off(rate["busy"], truth), irate["busy"], rate["idle"], irate["idle"])
	if truth < 0.1 {
		t.Errorf("the burner used only %.3f cores: the comparison says little", truth)
	}
	if off(rate["busy"], truth) > 0.05 {
		t.Errorf("busy: the rule's expression with rate %.4f cores, statsd's samples %.4f: off by more than 5%%", rate["busy"], truth)
	}
	if math.Abs(rate["idle"]) > 0.01 {
		t.Errorf("idle: the rule's expression with rate %.4f cores, want about 0", rate["idle"])
	}
}

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// procMemory returns pid's resident set and its peak (VmRSS, VmHWM), bytes,
// failing the test when they cannot be read.
func procMemory(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	rss, peak, err := testenv.ProcMemory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss, peak
}

// TestIntegrationHostileDaemonBounded: the statsagent binary, with actor
// labels (the worst case), polls two hostile daemons in its glob: one
// answering 20,000 samples (each its own actor and template) and one
// answering a sample with 20,000 open drift findings (each its own actor),
// next to a well-behaved one. /metrics stays small and the agent's peak RSS
// under 64 MiB; the well-behaved daemon's workload is still exported.
func TestIntegrationHostileDaemonBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with the statsagent binary; not under -short")
	}
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := t.TempDir()
	sample := func(actor, template string, drift uint32) *sandboxstatsv1.WorkloadStatsSample {
		return &sandboxstatsv1.WorkloadStatsSample{ActorUid: actor, ActorName: actor, ActorNamespace: "team",
			TemplateNamespace: "tmpl", TemplateName: template,
			SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, Source: sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
			MemoryCurrentBytes: 1 << 20, OpenDriftFindings: drift}
	}
	many := statsdfake.Start(t, filepath.Join(dir, "a-samples.sock"))
	var samples []*sandboxstatsv1.WorkloadStatsSample
	for i := range 20_000 {
		samples = append(samples, sample(fmt.Sprintf("s%05d", i), fmt.Sprintf("t%05d", i), 0))
	}
	many.Set(samples...)
	findings := statsdfake.Start(t, filepath.Join(dir, "b-findings.sock"))
	findings.Set(sample("f", "py", 1))
	var fs []*sandboxstatsv1.DriftFinding
	for i := range 20_000 {
		fs = append(fs, &sandboxstatsv1.DriftFinding{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, ActorUid: fmt.Sprintf("f%05d", i)})
	}
	findings.SetDrift(fs...)
	good := statsdfake.Start(t, filepath.Join(dir, "c-good.sock"))
	good.Set(sample("good", "py", 0))

	base, proc := testenv.StartStatsagentProcess(t, bin, dir, "--sockets", filepath.Join(dir, "*.sock"),
		"--interval", "500ms", "--min-interval", "100ms", "--timeout", "5s", "--label-actor", "--grace", "1m")
	m := testenv.WaitSweeps(t, base, 3)
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	series := 0
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "sandboxstats_") {
			series++
		}
	}
	rss, hwm := procMemory(t, proc.Pid)
	t.Logf("after 3 sweeps: /metrics %d bytes, %d sandboxstats_ series; agent RSS %.1f MiB, peak %.1f MiB",
		len(body), series, float64(rss)/(1<<20), float64(hwm)/(1<<20))
	if len(body) > 256<<10 {
		t.Errorf("/metrics is %d bytes, want under 256 KiB", len(body))
	}
	if hwm > 64<<20 {
		t.Errorf("agent peak RSS %.1f MiB, want under 64 MiB", float64(hwm)/(1<<20))
	}
	if _, ok := m["sandboxstats_workload_memory_current_bytes"+series3("good", "py")]; !ok {
		t.Errorf("the well-behaved daemon's workload is not exported")
	}
}

func series3(actor, template string) string {
	return fmt.Sprintf("{actor_name=%s,actor_namespace=team,actor_uid=%s,sandbox_class=gvisor,source=cgroup,template_name=%s,template_namespace=tmpl}",
		actor, actor, template)
}

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// templateSeries scrapes base/metrics and returns the template names its
// series carry and how many series (lines) carry a template label, and
// the scrape's sum of sandboxstats_activations_ended_total and of
// sandboxstats_agent_templates_folded_total.
func templateSeries(t *testing.T, base string) (names map[string]bool, series int, ended, folded float64) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`template_name="([^"]*)"`)
	names = map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if m := name.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "#") {
			names[m[1]] = true
			series++
		}
	}
	for k, v := range testenv.Scrape(t, base) {
		switch {
		case strings.HasPrefix(k, "sandboxstats_activations_ended_total{"):
			ended += v
		case strings.HasPrefix(k, "sandboxstats_agent_templates_folded_total{"):
			folded += v
		}
	}
	return names, series, ended, folded
}

// TestIntegrationTemplateSeriesBounded: 200 pods' worth of activations,
// each of a template of its own (as tenants name them), bound to real
// cgroups through a real statsd and sampled and ended under the statsagent
// binary with --max-templates 16: the agent exports at most 16 templates
// and (other) at once, every ended activation counted in the sum, the
// folds counted; past --ended-horizon (and --grace) no series carries a template
// label.
func TestIntegrationTemplateSeriesBounded(t *testing.T) {
	needCgroups(t)
	const (
		pods     = 200
		batch    = 50 // bound at once: each batch sampled, then ended
		maxTmpls = 16
		// The horizon outlasts the run (about 10 s), so that every ended
		// activation is in the sum at the end; statsd's --ended-retention
		// is shorter, as it must be.
		horizon = 15 * time.Second
	)
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	var cgs []string
	for i := range batch {
		cg := fmt.Sprintf("/statsagent-e2e-%d-tmpl-%02d", os.Getpid(), i)
		testCgroup(t, cg)
		cgs = append(cgs, cg)
	}
	d := startStatsdIn(t, bin, dir, "a", "--ended-retention", "2s", "--ended-max", "256", "--max-workloads", "64")
	base := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", "300ms", "--min-interval", "100ms", "--timeout", "2s", "--grace", "1s",
		"--ended-horizon", horizon.String(), "--max-templates", fmt.Sprint(maxTmpls))
	lc := lifecycleClient(t, d.Lifecycle)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	start := time.Now()
	most, mostSeries, sawOther := 0, 0, false
	note := func(names map[string]bool, series int) {
		most, mostSeries, sawOther = max(most, len(names)), max(mostSeries, series), sawOther || names["(other)"]
	}
	for first := 0; first < pods; first += batch {
		for i := range batch {
			k := first + i
			if _, err := lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
				Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cgs[i]},
				Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("pod-%03d", k), ActorName: fmt.Sprintf("pod-%03d", k),
					ActorNamespace: "tenant", TemplateNamespace: "tenant", TemplateName: fmt.Sprintf("fresh-%03d", k)},
			}); err != nil {
				t.Fatalf("RunWorkload pod-%03d: %v", k, err)
			}
		}
		testenv.WaitNewSweeps(t, base) // the batch sampled: live series of its templates
		names, series, _, _ := templateSeries(t, base)
		note(names, series)
		for i := range batch {
			if _, err := lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: fmt.Sprintf("pod-%03d", first+i)}); err != nil {
				t.Fatalf("CheckpointWorkload pod-%03d: %v", first+i, err)
			}
		}
	}
	// Every ended activation counted, under its name or (other).
	var names map[string]bool
	var series int
	var ended, folded float64
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		names, series, ended, folded = templateSeries(t, base)
		note(names, series)
		if ended >= pods || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("%d pods of fresh templates in %v: at most %d templates and %d series with a template label at once; %v activations ended counted, %v folds",
		pods, time.Since(start).Round(time.Millisecond), most, mostSeries, ended, folded)
	if ended != pods {
		t.Errorf("sandboxstats_activations_ended_total sums to %v, want %d (a folded template's activations count in (other))", ended, pods)
	}
	if most > maxTmpls+1 || !sawOther {
		t.Errorf("at most %d templates exported at once, (other) among them: %v; want at most %d with (other)", most, sawOther, maxTmpls+1)
	}
	if folded < pods-maxTmpls {
		t.Errorf("sandboxstats_agent_templates_folded_total = %v, want at least %d (each ended activation past the cap)", folded, pods-maxTmpls)
	}

	// Past the horizon (and the grace period) nothing carries a template
	// label.
	ended0 := time.Now()
	for deadline := ended0.Add(horizon + 10*time.Second); ; time.Sleep(200 * time.Millisecond) {
		names, series, _, _ = templateSeries(t, base)
		if series == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the last activation ended (--ended-horizon %v): %d series still carry %d templates", time.Since(ended0).Round(time.Millisecond), horizon, series, len(names))
		}
	}
	t.Logf("no series with a template label %v after the last activation ended (--ended-horizon %v)", time.Since(ended0).Round(time.Millisecond), horizon)
}

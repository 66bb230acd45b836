package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationPrometheusDeploy is the deployment as a fleet runs it, on
// one node: two real statsd on real v1 cgroups, one holding known memory
// (a child that allocated and touched 256 MiB), one burning CPU (a child
// spinning), the statsagent binary polling them, and Debian's Prometheus
// scraping the agent with deploy/prometheus/*.rules.yml loaded. PromQL
// answers within 5% of the cgroups' own counters (CPU cores over a window,
// the working set through its recording rule); promtool check metrics on the
// live scrape is clean; every rule evaluates healthy, and every expression of
// the rules and of the Grafana dashboard (deploy/grafana/sandboxstats.json)
// evaluates without error against this Prometheus; no alert fires on this
// healthy node.
func TestIntegrationPrometheusDeploy(t *testing.T) {
	needV1(t)
	testenv.NeedPrometheus(t)
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	cgAlloc := fmt.Sprintf("/prom-e2e-%d-alloc", os.Getpid())
	cgBurn := fmt.Sprintf("/prom-e2e-%d-burn", os.Getpid())
	testCgroup(t, cgAlloc)
	testCgroup(t, cgBurn)
	alloc := testenv.StartChild(t, "TestWorkloadChild")
	burn := testenv.StartChild(t, "TestWorkloadChild")
	moveTo(t, cgAlloc, alloc.Cmd.Process.Pid)
	moveTo(t, cgBurn, burn.Cmd.Process.Pid)
	alloc.Do(t, "alloc 256")

	for name, cg := range map[string]string{"alloc": cgAlloc, "burn": cgBurn} {
		d := startStatsdIn(t, bin, dir, name)
		statsctl(t, bin, "--lifecycle-socket", "unix://"+d.Lifecycle, "run-workload", "--actor-uid", "prom-"+name,
			"--actor-name", name, "--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", name,
			"--cgroup-path", cg) // the class is implied
	}
	agent := testenv.StartStatsagent(t, bin, dir, "--sockets", "unix://"+filepath.Join(dir, "stats", "*.sock"),
		"--interval", "250ms", "--min-interval", "100ms", "--timeout", "2s", "--grace", "1m", "--label-actor")
	rules, err := filepath.Glob("../deploy/prometheus/*.rules.yml")
	if err != nil || len(rules) < 2 {
		t.Fatalf("rule files %v, %v", rules, err)
	}
	u, _ := url.Parse(agent)
	prom := testenv.StartPrometheus(t, []string{u.Host}, 250*time.Millisecond, rules...)
	testenv.WaitSweeps(t, agent, 3)
	prom.WaitScraped(t) // Prometheus applies its targets some seconds after it is ready

	// CPU: a steady burn; the truth is the cgroup's own counter over the
	// window the rate covers.
	burn.Send(t, "burn 60000")
	time.Sleep(3 * time.Second) // first sight, then a few charged sweeps
	const window = 20 * time.Second
	t1, c1 := time.Now(), cgroupCPUUsec(t, cgBurn)
	time.Sleep(window)
	t2, c2 := time.Now(), cgroupCPUUsec(t, cgBurn)
	truthCores := float64(c2-c1) / 1e6 / t2.Sub(t1).Seconds()
	ws := v1WorkingSet(t, cgAlloc)
	time.Sleep(3 * time.Second) // the scrapes up to t2 are in
	q := fmt.Sprintf(`sum(rate(sandboxstats_workload_cpu_seconds_total{template_name="burn", source="cgroup"}[%ds]))`, int(window.Seconds()))
	cpu := prom.QueryAt(t, q, t2)
	wsRule := prom.Query(t, `template:sandboxstats_workload_memory_working_set_bytes:sum{template_name="alloc", source="cgroup"}`)
	if len(cpu) != 1 || len(wsRule) != 1 {
		t.Fatalf("prometheus answered %v for the CPU and %v for the working set", cpu, wsRule)
	}
	t.Logf("CPU: cgroup %.4f cores over %v, PromQL %.4f (%.4f of it); working set: cgroup %.1f MiB, recording rule %.1f MiB (%.4f of it)",
		truthCores, t2.Sub(t1).Round(time.Millisecond), cpu[0].Value, cpu[0].Value/truthCores,
		float64(ws)/(1<<20), wsRule[0].Value/(1<<20), wsRule[0].Value/float64(ws))
	if truthCores < 0.2 {
		t.Errorf("the burner used only %.3f cores: the comparison says little", truthCores)
	}
	if !within(cpu[0].Value, truthCores, 0.05) {
		t.Errorf("PromQL CPU %.4f cores, the cgroup's own %.4f: off by more than 5%%", cpu[0].Value, truthCores)
	}
	if !within(wsRule[0].Value, float64(ws), 0.05) || wsRule[0].Value < 256<<20 {
		t.Errorf("working set rule %.0f bytes, the cgroup's own %d (256 MiB held): off by more than 5%%", wsRule[0].Value, ws)
	}

	if out := testenv.PromtoolCheckMetrics(t, metricsText(t, agent)); out != "" {
		t.Errorf("promtool check metrics on the live scrape:\n%s", out)
	}

	// Every rule loaded, evaluated and healthy; every expression of the
	// rules and the dashboard evaluates.
	var loaded []testenv.PromRule
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		loaded = prom.Rules(t)
		done := len(loaded) > 0
		for _, r := range loaded {
			done = done && r.Evaluated
		}
		if done || time.Now().After(deadline) {
			break
		}
	}
	if n := ruleCount(t, rules); len(loaded) != n {
		t.Errorf("prometheus loaded %d rules, the files have %d", len(loaded), n)
	}
	for _, r := range loaded {
		if r.Health != "ok" || r.LastError != "" || !r.Evaluated {
			t.Errorf("rule %s (%s): health %q, evaluated %v, last error %q", r.Name, r.Group, r.Health, r.Evaluated, r.LastError)
		}
		if _, err := prom.QueryErr(r.Query); err != nil {
			t.Errorf("rule %s: %q: %v", r.Name, r.Query, err)
		}
	}
	for _, e := range dashboardExprs(t) {
		got, err := prom.QueryErr(e.expr)
		switch {
		case err != nil:
			t.Errorf("dashboard panel %q: %q: %v", e.panel, e.expr, err)
		case e.mustHaveData && len(got) == 0:
			t.Errorf("dashboard panel %q: %q: no data from a node that has it", e.panel, e.expr)
		}
	}
	if firing := prom.Alerts(t); len(firing) > 0 {
		t.Errorf("alerts on a healthy node: %v", firing)
	}
}

// v1WorkingSet is the cgroup's working set as statsd defines it on v1:
// memory.usage_in_bytes minus total_inactive_file.
func v1WorkingSet(t *testing.T, rel string) uint64 {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup/memory", rel)
	b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	usage, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "memory.stat"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "total_inactive_file "); ok {
			inactive, _ := strconv.ParseUint(v, 10, 64)
			return usage - min(usage, inactive)
		}
	}
	return usage
}

// ruleCount counts the rules of the rule files (their "- record:" and
// "- alert:" lines).
func ruleCount(t *testing.T, files []string) int {
	t.Helper()
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n += len(regexp.MustCompile(`(?m)^\s*- (record|alert):`).FindAll(b, -1))
	}
	return n
}

type dashExpr struct {
	panel, expr  string
	mustHaveData bool
}

// dashboardExprs extracts every query of the dashboard: the panels'
// targets, and the variables' label_values(metric, label) as the metric,
// with Grafana's variables replaced by what Grafana would send ("All" is
// .*). The panels over series this node has are marked mustHaveData.
func dashboardExprs(t *testing.T) []dashExpr {
	t.Helper()
	b, err := os.ReadFile("../deploy/grafana/sandboxstats.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query json.RawMessage
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$template", ".*", "$class", ".*", "$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h")
	haveData := map[string]bool{
		"CPU cores by template and class": true, "Working set by template and class": true, "Workloads sampled": true,
		"Fleet CPU cores": true, "Fleet working set": true, "Open drift findings": true, "Top 10 by CPU cores": true,
		"Top 10 by working set": true, "Activations ended by outcome (per minute)": false, "Agents up": true,
		"Seconds since the last sweep": true, "Daemons by result": true,
	}
	var out []dashExpr
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, dashExpr{panel: p.Title, expr: vars.Replace(tg.Expr), mustHaveData: haveData[p.Title]})
		}
	}
	lv := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil || q.Query == "" {
			continue // the datasource variable's query is a plain string
		}
		m := lv.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		out = append(out, dashExpr{panel: "variable " + v.Name, expr: m[1], mustHaveData: true})
	}
	if len(out) < 15 {
		t.Fatalf("only %d dashboard queries found", len(out))
	}
	return out
}

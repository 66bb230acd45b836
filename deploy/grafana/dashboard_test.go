package grafana_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type target struct {
	RefID      string          `json:"refId"`
	Expr       string          `json:"expr"`
	Datasource json.RawMessage `json:"datasource"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource json.RawMessage          `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []target                 `json:"targets"`
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("sandboxstats.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("sandboxstats.json: %v", err)
	}
	return d
}

// recorded returns the recording rules' names and every expression of the
// rule files.
func recorded(t *testing.T) (names, exprs []string) {
	t.Helper()
	for _, f := range []string{"../prometheus/sandboxstats.rules.yml", "../prometheus/sandboxstats-alerts.rules.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rf struct {
			Groups []struct {
				Rules []struct {
					Record string `json:"record"`
					Expr   string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					names = append(names, r.Record)
				}
				exprs = append(exprs, r.Expr)
			}
		}
	}
	return names, exprs
}

// exported is what statsagent exports: the metric names in
// internal/nodeagent/metrics.go, and the two of the memory limit and OOM
// kills that the cgroup signals work adds.
func exported(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../internal/nodeagent/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`"(sandboxstats_[a-z_]+)"`).FindAllSubmatch(b, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in metrics.go", names)
	}
	return append(names, "sandboxstats_workload_oom_kills_total", "sandboxstats_workload_memory_limit_bytes")
}

var seriesName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)

// unknownSeries returns the sandboxstats series expr names that are neither
// recorded nor exported (a histogram's _bucket, _sum and _count count as
// its name).
func unknownSeries(expr string, known []string) []string {
	var out []string
	for _, tok := range seriesName.FindAllString(expr, -1) {
		if !strings.Contains(tok, "sandboxstats") {
			continue
		}
		base := tok
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if s, ok := strings.CutSuffix(tok, suf); ok && slices.Contains(known, s) {
				base = s
			}
		}
		if !slices.Contains(known, base) {
			out = append(out, tok)
		}
	}
	return out
}

func TestDashboardPanels(t *testing.T) {
	d := load(t)
	if d.UID != "sandboxstats" || d.Title == "" {
		t.Errorf("uid %q title %q", d.UID, d.Title)
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Error("no datasource variable")
	}
	names, _ := recorded(t)
	known := append(names, exported(t)...)
	ids := map[int]bool{}
	var cells [][4]int
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
		}
		for _, c := range cells {
			if g.X < c[0]+c[2] && c[0] < g.X+g.W && g.Y < c[1]+c[3] && c[1] < g.Y+g.H {
				t.Errorf("panel %q overlaps another at %+v", p.Title, g)
			}
		}
		cells = append(cells, [4]int{g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			continue
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %s, %d targets", p.Title, p.Datasource, len(p.Targets))
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || refs[tg.RefID] || !strings.Contains(string(tg.Datasource), "${datasource}") {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
			for _, m := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q uses an undefined variable $%s", p.Title, m[1])
				}
			}
			if u := unknownSeries(tg.Expr, known); len(u) > 0 {
				t.Errorf("panel %q queries %v: neither recorded nor exported", p.Title, u)
			}
		}
	}
}

// TestDashboardCoversTheIssue: fleet CPU and memory by template, top
// sandboxes, drift, agent health, activations by outcome.
func TestDashboardCoversTheIssue(t *testing.T) {
	b, err := os.ReadFile("sandboxstats.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"template:sandboxstats_workload_cpu_cores:rate5m", "template:sandboxstats_workload_memory_working_set_bytes:sum",
		"topk(10, workload:sandboxstats_workload_cpu_cores:rate5m", "kind:sandboxstats_drift_open_findings:sum",
		`up{job=\"statsagent\"}`, "sandboxstats_agent_last_sweep_timestamp_seconds",
		"sum by (outcome) (template:sandboxstats_activations_ended:rate5m",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
}

// TestRulesQueryKnownSeries: the rules, too, read only what statsagent
// exports or they record.
func TestRulesQueryKnownSeries(t *testing.T) {
	names, exprs := recorded(t)
	known := append(names, exported(t)...)
	for _, e := range exprs {
		if u := unknownSeries(e, known); len(u) > 0 {
			t.Errorf("rule %q queries %v: neither recorded nor exported", e, u)
		}
	}
}

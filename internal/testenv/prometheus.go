package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NeedPrometheus checks that Debian's prometheus and promtool are installed
// (apt-get install prometheus) and returns their paths.
func NeedPrometheus(t testing.TB) (prometheus, promtool string) {
	t.Helper()
	prometheus, err1 := exec.LookPath("prometheus")
	promtool, err2 := exec.LookPath("promtool")
	Need(t, err1 == nil && err2 == nil, "needs prometheus and promtool in PATH (apt-get install prometheus)")
	return prometheus, promtool
}

// Prometheus is a real Prometheus server on loopback.
type Prometheus struct {
	url string // http://127.0.0.1:port
	dir string
}

// StartPrometheus starts Debian's prometheus on a free loopback port,
// scraping each target ("127.0.0.1:port") every scrapeInterval, with its
// TSDB, rules (ruleFiles are copied beside its config) and log in a
// temporary directory; the cleanup stops it. It waits for /-/ready.
func StartPrometheus(t testing.TB, targets []string, scrapeInterval time.Duration, ruleFiles ...string) *Prometheus {
	t.Helper()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	return StartPrometheusScrape(t, fmt.Sprintf("  - job_name: statsagent\n    static_configs:\n      - targets: [%s]\n", strings.Join(quoted, ", ")),
		scrapeInterval, ruleFiles...)
}

// StartPrometheusScrape is StartPrometheus with the scrape configs given:
// scrapeConfigs is the YAML list under scrape_configs (block or flow style),
// every line indented.
func StartPrometheusScrape(t testing.TB, scrapeConfigs string, scrapeInterval time.Duration, ruleFiles ...string) *Prometheus {
	t.Helper()
	bin, _ := NeedPrometheus(t)
	p := &Prometheus{dir: t.TempDir()}
	var rules []string
	for _, r := range ruleFiles {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(p.dir, filepath.Base(r))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		rules = append(rules, strconv.Quote(dst))
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: %s\n  evaluation_interval: %s\nrule_files: [%s]\nscrape_configs:\n%s",
		promDuration(scrapeInterval), promDuration(scrapeInterval), strings.Join(rules, ", "), scrapeConfigs)
	cfgPath := filepath.Join(p.dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	p.url = "http://127.0.0.1:" + strconv.Itoa(port)
	logPath := filepath.Join(p.dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(p.dir, "tsdb"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus.log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(p.url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus not ready within 30 s:\n%s", b)
		}
	}
}

func promDuration(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// PromSample is one series of an instant query's answer.
type PromSample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates a PromQL instant query now and returns its vector (or a
// scalar as one sample); an evaluation error fails the test.
func (p *Prometheus) Query(t testing.TB, query string) []PromSample {
	t.Helper()
	v, err := p.QueryErr(query)
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	return v
}

// QueryErr is Query returning the error.
func (p *Prometheus) QueryErr(query string) ([]PromSample, error) {
	return p.query(url.Values{"query": {query}})
}

// QueryAt evaluates a PromQL instant query at the given time; an evaluation
// error fails the test.
func (p *Prometheus) QueryAt(t testing.TB, query string, at time.Time) []PromSample {
	t.Helper()
	v, err := p.query(url.Values{"query": {query}, "time": {strconv.FormatFloat(float64(at.UnixNano())/1e9, 'f', 3, 64)}})
	if err != nil {
		t.Fatalf("query %q at %s: %v", query, at.Format(time.RFC3339Nano), err)
	}
	return v
}

func (p *Prometheus) query(params url.Values) ([]PromSample, error) {
	resp, err := http.Get(p.url + "/api/v1/query?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s", body.Error)
	}
	parse := func(v [2]any) (float64, error) {
		s, _ := v[1].(string)
		return strconv.ParseFloat(s, 64)
	}
	switch body.Data.ResultType {
	case "vector":
		var r []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(body.Data.Result, &r); err != nil {
			return nil, err
		}
		out := make([]PromSample, 0, len(r))
		for _, s := range r {
			f, err := parse(s.Value)
			if err != nil {
				return nil, err
			}
			out = append(out, PromSample{Labels: s.Metric, Value: f})
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(body.Data.Result, &v); err != nil {
			return nil, err
		}
		f, err := parse(v)
		return []PromSample{{Value: f}}, err
	}
	return nil, fmt.Errorf("result type %q", body.Data.ResultType)
}

// WaitScraped waits (up to 30 s) until every target has been scraped once:
// Prometheus applies its targets a few seconds after it is ready, so a rate
// over a window that starts before then covers less than the window.
func (p *Prometheus) WaitScraped(t testing.TB) {
	t.Helper()
	var targets int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var body struct {
			Data struct {
				ActiveTargets []struct {
					LastScrape time.Time `json:"lastScrape"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		p.getJSON(t, "/api/v1/targets", &body)
		scraped := 0
		for _, tg := range body.Data.ActiveTargets {
			if tg.LastScrape.Year() > 2000 {
				scraped++
			}
		}
		targets = len(body.Data.ActiveTargets)
		if targets > 0 && scraped == targets {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus scraped %d of %d targets within 30 s", scraped, targets)
		}
	}
}

// PromRule is one rule as the server loaded and last evaluated it.
type PromRule struct {
	Group, Name, Type, Query, Health, LastError string
	Evaluated                                   bool // evaluated at least once
}

// Rules returns the server's loaded rules (GET /api/v1/rules).
func (p *Prometheus) Rules(t testing.TB) []PromRule {
	t.Helper()
	var body struct {
		Data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name, Type, Query, Health, LastError string
					LastEvaluation                       time.Time `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	p.getJSON(t, "/api/v1/rules", &body)
	var out []PromRule
	for _, g := range body.Data.Groups {
		for _, r := range g.Rules {
			out = append(out, PromRule{Group: g.Name, Name: r.Name, Type: r.Type, Query: r.Query, Health: r.Health,
				LastError: r.LastError, Evaluated: r.LastEvaluation.Year() > 2000})
		}
	}
	return out
}

// Alerts returns the pending and firing alerts (GET /api/v1/alerts): name
// and state.
func (p *Prometheus) Alerts(t testing.TB) map[string]string {
	t.Helper()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	p.getJSON(t, "/api/v1/alerts", &body)
	out := map[string]string{}
	for _, a := range body.Data.Alerts {
		out[a.Labels["alertname"]] = a.State
	}
	return out
}

func (p *Prometheus) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	resp, err := http.Get(p.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// PromtoolCheckMetrics runs `promtool check metrics` on text and returns
// what it printed (nothing when the exposition is clean).
func PromtoolCheckMetrics(t testing.TB, text []byte) string {
	t.Helper()
	_, promtool := NeedPrometheus(t)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

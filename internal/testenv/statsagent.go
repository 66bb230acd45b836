package testenv

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// StartStatsagent runs binDir/statsagent with args and --metrics-listen
// 127.0.0.1:0, its log in dir/statsagent.log, and returns its base URL
// ("http://127.0.0.1:port"). The cleanup stops it with SIGTERM and fails
// the test if it does not exit cleanly within 10 s.
func StartStatsagent(t testing.TB, binDir, dir string, args ...string) string {
	t.Helper()
	url, _ := StartStatsagentProcess(t, binDir, dir, args...)
	return url
}

// StartStatsagentProcess is StartStatsagent also returning the process (to
// read its /proc/<pid>/status).
func StartStatsagentProcess(t testing.TB, binDir, dir string, args ...string) (string, *os.Process) {
	t.Helper()
	logPath := filepath.Join(dir, "statsagent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "statsagent"), append(args, "--metrics-listen", "127.0.0.1:0")...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		StopProcess(t, cmd, "statsagent")
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("statsagent.log:\n%s", b)
		}
	})
	re := regexp.MustCompile(`msg="statsagent serving" addr=(\S+)`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(logPath)
		if m := re.FindSubmatch(b); m != nil {
			return "http://" + string(m[1]), cmd.Process
		}
	}
	b, _ := os.ReadFile(logPath)
	t.Fatalf("statsagent did not start:\n%s", b)
	return "", nil
}

// Scrape GETs base/metrics, parses it with the Prometheus text parser and
// returns the sandboxstats_ series as "name{k=v,...}" -> value (labels
// sorted); a histogram gives "name_sum{...}" and "name_count{...}".
func Scrape(t testing.TB, base string) map[string]float64 {
	t.Helper()
	return ScrapeURL(t, base+"/metrics", "sandboxstats_")
}

// ScrapeURL is Scrape of the metrics at url, the series whose name starts
// with prefix.
func ScrapeURL(t testing.TB, url, prefix string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	out := make(map[string]float64)
	for name, f := range fams {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(ls)
			labels := "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Gauge != nil:
				out[name+labels] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name+labels] = m.GetCounter().GetValue()
			case m.Histogram != nil:
				out[name+"_sum"+labels] = m.GetHistogram().GetSampleSum()
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// WaitSweeps scrapes base until at least n sweeps completed (within 30 s)
// and returns that scrape.
func WaitSweeps(t testing.TB, base string, n float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := Scrape(t, base)
		if m["sandboxstats_agent_sweeps_total{}"] >= n {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %v sweeps after 30 s: %v", n, m["sandboxstats_agent_sweeps_total{}"])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitNewSweeps waits until a sweep that started after the call completed
// (call it after the action whose effect the scrape must show).
func WaitNewSweeps(t testing.TB, base string) map[string]float64 {
	t.Helper()
	return WaitSweeps(t, base, Scrape(t, base)["sandboxstats_agent_sweeps_total{}"]+2)
}

// StopProcess stops cmd with SIGTERM (SIGKILL after 10 s, an error) and
// waits for it; an exit other than 0 is an error of the test.
func StopProcess(t testing.TB, cmd *exec.Cmd, name string) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM", name, err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("%s did not stop within 10 s of SIGTERM", name)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// cpuRule is kube-prometheus's per-container CPU recording rule
// (testdata/kube-prometheus-k8s-cpu.rules.yml).
const cpuRule = "node_namespace_pod_container:container_cpu_usage_seconds_total:sum_irate"

// TestIntegrationPrometheusContainerRule: Debian's Prometheus evaluating
// kube-prometheus's recording rule
// node_namespace_pod_container:container_cpu_usage_seconds_total:sum_irate
// (its expression, as kube-prometheus renders it) over statsagent's opt-in
// --cadvisor-compat export, scraped through
// deploy/prometheus/cadvisor-compat.scrape.yml's relabelling (the file
// loaded, only its interval and target set) and joined with a static
// kube_pod_info served by a tiny exporter standing in for kube-state-metrics.
// The workload: a Kata pod on the guest-agent fake (hybrid vsock: a Unix
// socket and CONNECT) whose three containers' guest cgroup CPU counters
// advance at 0.5, 0.2 and 0 cores (the truth), bound in the statsd binary;
// statsagent sweeps every 1 s, Prometheus scrapes and evaluates every 1 s.
// Each container's rule value equals its truth within 5%: the median of the
// rule's values over a window (irate takes the last two scrapes, each of
// the last sweep, so one value is off when a scrape sees no new sweep or
// two); the same expression with rate over the window is held to 5% too.
func TestIntegrationPrometheusContainerRule(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with statsd, statsagent and Prometheus; not under -short")
	}
	testenv.NeedPrometheus(t)
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	const namespace, pod = "team", "kata-pod"
	truth := map[string]float64{"app": 0.5, "sidecar": 0.2, "idle": 0}

	// The guest's counters advance with the wall clock, from a
	// second's worth of CPU already used.
	var opts []kataagentfake.Option
	start := time.Now()
	reply := func(cores float64) *kataagentfake.Container {
		ns := uint64(cores * float64(time.Since(start).Nanoseconds()+int64(time.Second)))
		return &kataagentfake.Container{UsageBytes: 32 << 20, CPUTotal: ns, CPUUser: ns / 10 * 7, CPUSystem: ns - ns/10*7, Pids: 2}
	}
	ids := slices.Sorted(maps.Keys(truth))
	for _, id := range ids {
		opts = append(opts, kataagentfake.WithContainer(id, kataagentfake.V2(*reply(truth[id]))))
	}
	agent := kataagentfake.New(t, t.TempDir(), opts...)
	ctx, stopClock := context.WithCancel(context.Background())
	defer stopClock()
	go func() {
		for tick := time.NewTicker(10 * time.Millisecond); ctx.Err() == nil; <-tick.C {
			for _, id := range ids {
				agent.SetContainer(id, kataagentfake.V2(*reply(truth[id])))
			}
		}
	}()

	d := startStatsdIn(t, bin, dir, "kata")
	_, life := clients(t, d)
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := life.RunWorkload(rctx, &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "kata-pod-uid", ActorName: pod, ActorNamespace: namespace, TemplateNamespace: "tmpl", TemplateName: "py"},
		Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: agent.Address(),
			ContainerIds: ids},
	})
	cancel()
	if err != nil {
		t.Fatalf("RunWorkload: %v", err)
	}
	prom := startRuleStack(t, bin, dir, namespace, pod, len(truth))
	t.Logf("%v: the rule has a value for each container", time.Since(start).Round(time.Millisecond))
	const window = 8 * time.Second
	time.Sleep(window)
	sel := fmt.Sprintf("{namespace=%q, pod=%q, node=\"node-1\"}", namespace, pod)
	median := byContainer(prom.Query(t, fmt.Sprintf("quantile_over_time(0.5, %s%s[%ds])", cpuRule, sel, int(window.Seconds()))))
	lo := byContainer(prom.Query(t, fmt.Sprintf("min_over_time(%s%s[%ds])", cpuRule, sel, int(window.Seconds()))))
	hi := byContainer(prom.Query(t, fmt.Sprintf("max_over_time(%s%s[%ds])", cpuRule, sel, int(window.Seconds()))))
	n := byContainer(prom.Query(t, fmt.Sprintf("count_over_time(%s%s[%ds])", cpuRule, sel, int(window.Seconds()))))
	rate := byContainer(prom.Query(t, rateRule(t, window)))
	for _, c := range ids {
		want := truth[c]
		t.Logf("%s: truth %.3f cores; the rule over %v: median %.4f (%.1f%% off), min %.4f, max %.4f, %v values; rate over the window %.4f (%.1f%% off)",
			c, want, window, median[c], 100*off(median[c], want), lo[c], hi[c], n[c], rate[c], 100*off(rate[c], want))
		if _, ok := median[c]; !ok || n[c] < window.Seconds()/2 {
			t.Errorf("%s: the rule has %v values over %v, want one a second", c, n[c], window)
			continue
		}
		if off(median[c], want) > 0.05 {
			t.Errorf("%s: the rule's median %.4f cores, truth %.3f: off by more than 5%%", c, median[c], want)
		}
		if off(rate[c], want) > 0.05 {
			t.Errorf("%s: the rule's expression with rate over %v: %.4f cores, truth %.3f: off by more than 5%%", c, window, rate[c], want)
		}
	}
	// The series behind it: the cAdvisor names and labels, relabelled
	// as the kubelet's.
	raw := prom.Query(t, `container_cpu_usage_seconds_total`)
	for _, s := range raw {
		if s.Labels["job"] != "kubelet" || s.Labels["metrics_path"] != "/metrics/cadvisor" || s.Labels["image"] == "" || s.Labels["namespace"] != namespace || s.Labels["pod"] != pod {
			t.Errorf("series %v: want job kubelet, metrics_path /metrics/cadvisor, an image, namespace %s, pod %s", s.Labels, namespace, pod)
		}
	}
	if len(raw) != len(truth) {
		t.Errorf("%d container_cpu_usage_seconds_total series, want %d: %v", len(raw), len(truth), raw)
	}
	if others := prom.Query(t, `count({job="kubelet", __name__!~"container_.*|up|scrape_.*"})`); len(others) > 0 {
		t.Errorf("the cAdvisor-shaped scrape kept series that are not container_*: %v", others)
	}
}

// startRuleStack starts, over the statsd processes of dir (fleetDir),
// statsagent --cadvisor-compat sweeping every 1 s, the kube_pod_info
// exporter for namespace/pod on node-1, and Prometheus scraping both every
// 1 s through cadvisor-compat.scrape.yml with the rule loaded; it returns
// once the rule has a value for each of the pod's containers.
func startRuleStack(t *testing.T, bin, dir, namespace, pod string, containers int) *testenv.Prometheus {
	t.Helper()
	metrics := testenv.StartStatsagent(t, bin, dir, "--sockets", "unix://"+dir+"/stats/*.sock",
		"--interval", "1s", "--min-interval", "1s", "--timeout", "2s", "--grace", "1m", "--cadvisor-compat")
	ksm := servePodInfo(t, namespace, pod, "node-1")
	au, _ := url.Parse(metrics)
	prom := testenv.StartPrometheusScrape(t, cadvisorScrapeConfigs(t, au.Host, ksm), time.Second,
		"testdata/kube-prometheus-k8s-cpu.rules.yml")
	testenv.WaitSweeps(t, metrics, 2)
	prom.WaitScraped(t)
	sel := fmt.Sprintf("%s{namespace=%q, pod=%q}", cpuRule, namespace, pod)
	waitFor(t, 30*time.Second, func() bool { return len(prom.Query(t, sel)) == containers }, "the rule's value for each container")
	return prom
}

// off is how far got is from want, as a fraction of want; for want 0,
// whether got is not 0.
func off(got, want float64) float64 {
	if want == 0 {
		if got == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Abs(got-want) / want
}

// byContainer maps each sample by its container label.
func byContainer(v []testenv.PromSample) map[string]float64 {
	out := make(map[string]float64, len(v))
	for _, s := range v {
		out[s.Labels["container"]] = s.Value
	}
	return out
}

// ruleExpr is the expression of cpuRule in the rule file.
func ruleExpr(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/kube-prometheus-k8s-cpu.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record == cpuRule {
				return r.Expr
			}
		}
	}
	t.Fatalf("no rule %s in the rule file", cpuRule)
	return ""
}

// rateRule is the rule's expression with rate over window for irate over
// 5m.
func rateRule(t *testing.T, window time.Duration) string {
	t.Helper()
	e := strings.Replace(ruleExpr(t), "irate(", "rate(", 1)
	return strings.Replace(e, "[5m]", fmt.Sprintf("[%ds]", int(window.Seconds())), 1)
}

// cadvisorScrapeConfigs is deploy/prometheus/cadvisor-compat.scrape.yml's
// one scrape config, its interval 1 s and its target statsagent at agent,
// and a scrape of the kube_pod_info exporter at ksm as kube-state-metrics'
// (honor_labels), as the list under scrape_configs (flow style).
func cadvisorScrapeConfigs(t *testing.T, agent, ksm string) string {
	t.Helper()
	b, err := os.ReadFile("../deploy/prometheus/cadvisor-compat.scrape.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		ScrapeConfigs []map[string]any `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.ScrapeConfigs) != 1 {
		t.Fatalf("cadvisor-compat.scrape.yml: %d scrape configs, want 1", len(f.ScrapeConfigs))
	}
	sc := f.ScrapeConfigs[0]
	sc["scrape_interval"] = "1s"
	sc["static_configs"] = []any{map[string]any{"targets": []string{agent}}}
	ksmJob := map[string]any{"job_name": "kube-state-metrics", "honor_labels": true,
		"static_configs": []any{map[string]any{"targets": []string{ksm}}}}
	out, err := json.Marshal([]any{sc, ksmJob})
	if err != nil {
		t.Fatal(err)
	}
	return "  " + string(out) + "\n"
}

// servePodInfo serves, on a loopback port until the test ends, the one
// kube_pod_info series kube-state-metrics would export for the pod, and
// returns its host:port.
func servePodInfo(t *testing.T, namespace, pod, node string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("# HELP kube_pod_info Information about pod.\n# TYPE kube_pod_info gauge\n"+
		"kube_pod_info{namespace=%q,pod=%q,uid=\"00000000-0000-0000-0000-000000000031\",host_ip=\"127.0.0.1\",pod_ip=\"10.0.0.31\",node=%q,created_by_kind=\"<none>\",created_by_name=\"<none>\",priority_class=\"\",host_network=\"false\"} 1\n",
		namespace, pod, node)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(body))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

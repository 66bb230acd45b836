package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/telemetry"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

var addrRE = regexp.MustCompile(`msg="statsagent serving" addr=(\S+)`)

// startAgent runs statsagent in-process with args and returns the base URL
// of its metrics server, a function that stops it (and checks that it
// stopped cleanly) and its log.
func startAgent(t *testing.T, args ...string) (string, func(), *testenv.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &testenv.SyncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, append(args, "--metrics-listen", "127.0.0.1:0"), logs) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if m := addrRE.FindStringSubmatch(logs.String()); m != nil {
			stopped := false
			stop := func() {
				if stopped {
					return
				}
				stopped = true
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("run returned %v after shutdown", err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("statsagent did not stop within 5 s of cancellation")
				}
			}
			t.Cleanup(stop)
			return "http://" + m[1], stop, logs
		}
		select {
		case err := <-done:
			t.Fatalf("statsagent exited early: %v\n%s", err, logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("statsagent did not start:\n%s", logs)
		}
	}
}

func scrape(t *testing.T, base string) map[string]float64 { return testenv.Scrape(t, base) }

func waitSweeps(t *testing.T, base string, n float64) map[string]float64 {
	return testenv.WaitSweeps(t, base, n)
}

var epoch1 = time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC).UnixNano()

func workload(actor string, class sandboxstatsv1.SandboxClass, src sandboxstatsv1.StatsSource, cpuUsec, mem uint64, peak *uint64) *sandboxstatsv1.WorkloadStatsSample {
	return &sandboxstatsv1.WorkloadStatsSample{
		ActorUid: actor, ActorName: actor, ActorNamespace: "team",
		TemplateNamespace: "tmpl", TemplateName: "py",
		SandboxClass: class, Source: src,
		MemoryCurrentBytes: mem, MemoryWorkingSetBytes: mem - mem/4, MemoryPeakBytes: peak,
		CpuUsageUsec: proto.Uint64(cpuUsec), EpochUnixNano: epoch1,
	}
}

func series(actor, class, src string) string {
	return fmt.Sprintf("{actor_name=%s,actor_namespace=team,actor_uid=%s,sandbox_class=%s,source=%s,template_name=py,template_namespace=tmpl}",
		actor, actor, class, src)
}

// TestAgentAgainstFakes runs statsagent in process (run) against five fake
// statsd daemons on Unix sockets (one hung, one killed mid-test) and checks
// what it exports. A component test; the binary against a real statsd is
// e2e's TestIntegrationRealStatsd.
func TestAgentAgainstFakes(t *testing.T) {
	const (
		gv = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR
		mv = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM
		cg = sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP
		ga = sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
		// Long enough that a healthy fake answers within it on a loaded
		// 2-core machine; the hung one costs exactly this much.
		tmo = 2 * time.Second
	)
	dir := t.TempDir()
	d1 := statsdfake.Start(t, filepath.Join(dir, "d1.sock"))
	d2 := statsdfake.Start(t, filepath.Join(dir, "d2.sock"))
	d3 := statsdfake.Start(t, filepath.Join(dir, "d3.sock"))
	hung := statsdfake.Start(t, filepath.Join(dir, "d4-hung.sock"))
	d5 := statsdfake.Start(t, filepath.Join(dir, "d5.sock"))
	d1.Set(workload("w1", gv, cg, 10_000_000, 100<<20, proto.Uint64(150<<20)))
	d2.Set(workload("w2", gv, cg, 3_000_000, 40<<20, proto.Uint64(41<<20)))
	d3.Set(workload("w3", mv, ga, 900_000, 20<<20, nil))
	hung.Hang()
	d5.Set(workload("w5", gv, cg, 1_000, 8<<20, proto.Uint64(9<<20)))

	base, stop, logs := startAgent(t, "--sockets", filepath.Join(dir, "*.sock"),
		"--interval", "1s", "--min-interval", "100ms", "--timeout", tmo.String(), "--label-actor", "--grace", "1m")

	// Sweep 1: values match what each daemon returned; first sight
	// charges no CPU.
	m := waitSweeps(t, base, 1)
	want := map[string]float64{
		"sandboxstats_workload_memory_current_bytes" + series("w1", "gvisor", "cgroup"):           100 << 20,
		"sandboxstats_workload_memory_current_bytes" + series("w2", "gvisor", "cgroup"):           40 << 20,
		"sandboxstats_workload_memory_current_bytes" + series("w3", "microvm", "guest-agent"):     20 << 20,
		"sandboxstats_workload_memory_current_bytes" + series("w5", "gvisor", "cgroup"):           8 << 20,
		"sandboxstats_workload_memory_working_set_bytes" + series("w1", "gvisor", "cgroup"):       75 << 20,
		"sandboxstats_workload_memory_working_set_bytes" + series("w2", "gvisor", "cgroup"):       30 << 20,
		"sandboxstats_workload_memory_working_set_bytes" + series("w3", "microvm", "guest-agent"): 15 << 20,
		"sandboxstats_workload_memory_working_set_bytes" + series("w5", "gvisor", "cgroup"):       6 << 20,
		"sandboxstats_workload_memory_peak_bytes" + series("w1", "gvisor", "cgroup"):              150 << 20,
		"sandboxstats_workload_memory_peak_bytes" + series("w2", "gvisor", "cgroup"):              41 << 20,
		"sandboxstats_workload_memory_peak_bytes" + series("w5", "gvisor", "cgroup"):              9 << 20,
		"sandboxstats_workload_cpu_seconds_total" + series("w1", "gvisor", "cgroup"):              0,
		"sandboxstats_workload_cpu_seconds_total" + series("w2", "gvisor", "cgroup"):              0,
		"sandboxstats_workload_cpu_seconds_total" + series("w3", "microvm", "guest-agent"):        0,
		"sandboxstats_workload_cpu_seconds_total" + series("w5", "gvisor", "cgroup"):              0,
		"sandboxstats_sampled_workloads" + series("w1", "gvisor", "cgroup"):                       1,
		"sandboxstats_sampled_workloads" + series("w2", "gvisor", "cgroup"):                       1,
		"sandboxstats_sampled_workloads" + series("w3", "microvm", "guest-agent"):                 1,
		"sandboxstats_sampled_workloads" + series("w5", "gvisor", "cgroup"):                       1,
		"sandboxstats_agent_daemons{result=ok}":                                                   4,
		"sandboxstats_agent_daemons{result=error}":                                                1,
		"sandboxstats_agent_daemons{result=no-sample}":                                            0,
		"sandboxstats_agent_daemons{result=vanished}":                                             0,
		"sandboxstats_agent_daemons{result=skipped}":                                              0,
		"sandboxstats_agent_actor_conflicts_total{}":                                              0,
		"sandboxstats_agent_containers_folded_total{}":                                            0,
		"sandboxstats_agent_poll_errors_total{code=DeadlineExceeded}":                             1,
		"sandboxstats_agent_sweeps_total{}":                                                       1,
		"sandboxstats_agent_templates_folded_total{}":                                             0,
		"sandboxstats_agent_sweep_duration_seconds_count{}":                                       1,
		"sandboxstats_agent_discovery_failures_total{}":                                           0,
		"sandboxstats_agent_http_connections_refused_total{}":                                     0,
		"sandboxstats_agent_http_requests_refused_total{}":                                        0,
		"sandboxstats_agent_implausible_samples_total{reason=absurd}":                             0,
		"sandboxstats_agent_implausible_samples_total{reason=growth}":                             0,
		"sandboxstats_agent_implausible_samples_total{reason=overflow}":                           0,
		"sandboxstats_agent_ended_records_evicted_total{}":                                        0,
		"sandboxstats_agent_ended_records_lost_total{}":                                           0,
	}
	got := withoutTimes(m)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("first sweep (-want +got):\n%s\nlog:\n%s", diff, logs)
	}
	checkServedInRegistry(t, m)
	// The hung daemon cost one timeout and did not delay the others.
	if d := m["sandboxstats_agent_last_sweep_duration_seconds{}"]; d < tmo.Seconds() || d > tmo.Seconds()+1.5 {
		t.Errorf("sweep took %.3f s, want about one timeout (%v)", d, tmo)
	}

	// w1 uses 2 s of CPU, then is restored (new epoch, counter from 0.5 s);
	// w2 uses 1.5 s; d5 is killed.
	d1.Set(workload("w1", gv, cg, 12_000_000, 100<<20, proto.Uint64(150<<20)))
	d2.Set(workload("w2", gv, cg, 4_500_000, 40<<20, proto.Uint64(41<<20)))
	d5.Kill()
	m = testenv.WaitNewSweeps(t, base)
	cpuW1 := "sandboxstats_workload_cpu_seconds_total" + series("w1", "gvisor", "cgroup")
	checkCPU := func(m map[string]float64, w1, w2 float64) {
		t.Helper()
		if got := m[cpuW1]; got != w1 {
			t.Errorf("w1 cpu = %v s, want %v", got, w1)
		}
		if got := m["sandboxstats_workload_cpu_seconds_total"+series("w2", "gvisor", "cgroup")]; got != w2 {
			t.Errorf("w2 cpu = %v s, want %v", got, w2)
		}
	}
	checkCPU(m, 2, 1.5)
	if _, ok := m["sandboxstats_workload_memory_current_bytes"+series("w5", "gvisor", "cgroup")]; ok {
		t.Errorf("killed daemon's workload still has a memory gauge")
	}
	if got := m["sandboxstats_workload_cpu_seconds_total"+series("w5", "gvisor", "cgroup")]; got != 0 {
		t.Errorf("killed daemon's CPU counter = %v, want kept at 0 within the grace period", got)
	}
	if got := m["sandboxstats_agent_daemons{result=ok}"]; got != 3 {
		t.Errorf("daemons ok = %v after the kill, want 3", got)
	}

	restored := workload("w1", gv, cg, 500_000, 30<<20, proto.Uint64(31<<20))
	restored.EpochUnixNano = time.Now().UnixNano()
	d1.Set(restored)
	m = testenv.WaitNewSweeps(t, base)
	// The cgroup counter restarted with the epoch: its 0.5 s are charged in
	// full, and the exported counter never decreased.
	checkCPU(m, 2.5, 1.5)
	if got := m["sandboxstats_workload_memory_peak_bytes"+series("w1", "gvisor", "cgroup")]; got != 31<<20 {
		t.Errorf("w1 peak after restore = %v, want the new epoch's %v", got, 31<<20)
	}

	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "ok") {
		t.Errorf("/healthz = %s %q", resp.Status, body)
	}
	stop()
	if !strings.Contains(logs.String(), "statsagent stopped") {
		t.Errorf("no clean-stop log line:\n%s", logs)
	}
}

// withoutTimes drops the series whose values are wall-clock dependent (and
// the open connections, which depend on when the server closes the last).
func withoutTimes(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		if strings.HasPrefix(k, "sandboxstats_agent_last_sweep_") || k == "sandboxstats_agent_sweep_duration_seconds_sum{}" ||
			k == "sandboxstats_agent_http_connections_open{}" {
			continue
		}
		out[k] = v
	}
	return out
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name         string
		args         []string
		wantInterval time.Duration
		wantWarnings int
		wantErr      bool
	}{
		{"defaults", nil, time.Minute, 0, false},
		{"interval clamped to the floor", []string{"--interval", "1s"}, 15 * time.Second, 1, false},
		{"custom floor", []string{"--interval", "1s", "--min-interval", "500ms", "--timeout", "100ms", "--grace", "1m"}, time.Second, 0, false},
		{"zero disables sweeping, no clamp", []string{"--interval", "0"}, 0, 0, false},
		{"timeout not below interval", []string{"--interval", "20s", "--timeout", "20s"}, 20 * time.Second, 1, false},
		{"zero concurrency", []string{"--concurrency", "0"}, 0, 0, true},
		{"zero timeout", []string{"--timeout", "0"}, 0, 0, true},
		{"stray argument", []string{"extra"}, 0, 0, true},
		{"allowed uids", []string{"--allow-socket-uids", "0, 990"}, time.Minute, 0, false},
		{"a uid that is not one", []string{"--allow-socket-uids", "root"}, 0, 0, true},
		{"negative sweep timeout", []string{"--sweep-timeout", "-1s"}, 0, 0, true},
		{"zero cap", []string{"--max-samples", "0"}, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, warnings, err := parseFlags(tc.args, io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if o.agent.Interval != tc.wantInterval || len(warnings) != tc.wantWarnings {
				t.Errorf("interval %v warnings %q, want %v and %d warnings", o.agent.Interval, warnings, tc.wantInterval, tc.wantWarnings)
			}
		})
	}
}

// TestSmallGraceStillChargesCPU: a --grace below the time between sweeps
// would forget every workload before it is seen again (every sample a first
// sight, nothing ever charged); it is raised to 2 x --interval + --timeout,
// with a warning, and CPU is charged across sweeps.
func TestSmallGraceStillChargesCPU(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantGrace time.Duration
	}{
		{[]string{"--interval", "20s", "--timeout", "5s", "--grace", "1s"}, 45 * time.Second},
		{[]string{"--interval", "20s", "--timeout", "5s", "--grace", "20s"}, 45 * time.Second},
		{[]string{"--interval", "20s", "--timeout", "5s", "--grace", "1h"}, time.Hour},
		{[]string{"--interval", "0", "--grace", "0"}, 0},
	} {
		o, warnings, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.agent.Grace != tc.wantGrace {
			t.Errorf("parseFlags(%q): grace %v (warnings %q), want %v", tc.args, o.agent.Grace, warnings, tc.wantGrace)
		}
	}

	const gv, cg = sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP
	dir := t.TempDir()
	d := statsdfake.Start(t, filepath.Join(dir, "d.sock"))
	d.Set(workload("w1", gv, cg, 1_000_000, 10<<20, nil))
	base, _, logs := startAgent(t, "--sockets", filepath.Join(dir, "*.sock"),
		"--interval", "250ms", "--min-interval", "100ms", "--timeout", "1s", "--label-actor", "--grace", "1ms")
	waitSweeps(t, base, 1)
	d.Set(workload("w1", gv, cg, 3_000_000, 10<<20, nil))
	m := testenv.WaitNewSweeps(t, base)
	if got := m["sandboxstats_workload_cpu_seconds_total"+series("w1", "gvisor", "cgroup")]; got != 2 {
		t.Errorf("cpu = %v s with --grace 1ms, want 2 (charged across sweeps)\nlog:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "--grace 1ms is below 2 x --interval + --timeout") || !strings.Contains(logs.String(), "using 1.5s") {
		t.Errorf("no warning that --grace was raised to 1.5s:\n%s", logs)
	}
}

// TestIntervalZero: sweeping disabled, the agent still serves its health
// and its own metrics, and never polls.
func TestIntervalZero(t *testing.T) {
	dir := t.TempDir()
	d := statsdfake.Start(t, filepath.Join(dir, "d.sock"))
	base, stop, _ := startAgent(t, "--sockets", filepath.Join(dir, "*.sock"), "--interval", "0")
	time.Sleep(200 * time.Millisecond)
	m := scrape(t, base)
	if got := m["sandboxstats_agent_sweeps_total{}"]; got != 0 {
		t.Errorf("sweeps = %v with --interval 0", got)
	}
	stop()
	if d.Calls() != 0 {
		t.Errorf("daemon polled %d times with --interval 0", d.Calls())
	}
}

// checkServedInRegistry: every metric the binary serves (the sweep's, the
// metrics server's, discovery's, not only those internal/nodeagent's
// TestRegistry sees) is declared in docs/telemetry/registry.yaml.
func checkServedInRegistry(t *testing.T, served map[string]float64) {
	t.Helper()
	reg, err := telemetry.Load("../../docs/telemetry/registry.yaml")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, n := range reg.PrometheusNames() {
		declared[n] = true
	}
	for series := range served {
		name, _, _ := strings.Cut(series, "{")
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && declared[b] {
				base = b
			}
		}
		if !declared[base] {
			t.Errorf("served metric %s is not in docs/telemetry/registry.yaml", name)
		}
	}
}

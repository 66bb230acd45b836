package e2e

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// otlpOutage is how long the collector is down mid-churn.
const otlpOutage = 30 * time.Second

// dedupeByUID returns logs with each log.record.uid once (the first
// arrival), as a consumer deduplicating by it keeps them, and how many
// arrivals were duplicates (an export whose outcome was unknown, sent
// again). Records without a uid are kept.
func dedupeByUID(logs []testenv.CollectedLog) (unique []testenv.CollectedLog, dups int) {
	seen := map[string]bool{}
	for _, l := range logs {
		uid, _ := l.Attributes["log.record.uid"].(string)
		if uid != "" && seen[uid] {
			dups++
			continue
		}
		seen[uid] = uid != ""
		unique = append(unique, l)
	}
	return unique, dups
}

// finalsByActor returns the final usage events that arrived, by actor uid,
// and the activations (actor, epoch, kind) that arrived more than once.
func finalsByActor(logs []testenv.CollectedLog) (finals map[string][]testenv.CollectedLog, twice []string) {
	finals = map[string][]testenv.CollectedLog{}
	seen := map[string]bool{}
	for _, l := range logs {
		if l.EventName != "sandboxstats.workload.usage_sampled" {
			continue
		}
		kind, _ := l.Attributes["sandboxstats.stats.kind"].(string)
		actor, _ := l.Attributes["sandboxstats.actor.uid"].(string)
		key := fmt.Sprint(actor, "/", l.Attributes["sandboxstats.activation.epoch"], "/", kind, "/", l.Attributes["sandboxstats.stats.observed_at"])
		if seen[key] {
			twice = append(twice, key)
		}
		seen[key] = true
		if kind == "final" {
			finals[actor] = append(finals[actor], l)
		}
	}
	return finals, twice
}

// latestCounter sums, over the attribute sets whose attrs include match,
// the latest point of the named cumulative counter.
func latestCounter(pts []testenv.CollectedPoint, name, match string) (sum float64, sets int) {
	latest := map[string]testenv.CollectedPoint{}
	for _, p := range pts {
		if p.Metric != name {
			continue
		}
		var kv []string
		for k, v := range p.Attributes {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		key := strings.Join(kv, ",")
		if !strings.Contains(key, match) {
			continue
		}
		if old, ok := latest[key]; !ok || p.TimeUnixNano > old.TimeUnixNano {
			latest[key] = p
		}
	}
	for _, p := range latest {
		sum += p.Value
	}
	return sum, len(latest)
}

// TestIntegrationOTLPChurn is the OTLP issue's end to end test with real
// parts: a real OpenTelemetry Collector (built from the upstream modules,
// e2e/otelcol) on loopback, the statsagent binary pushing to it over
// OTLP/gRPC, two statsd, and a churn of activations on real cgroups (one
// whose statsd restarts right after its Checkpoint). The collector is
// stopped for 30 s mid-churn and started again. Afterwards: the sum of the
// final events' CPU and the latest cumulative container.cpu.time each
// equal the cgroups' own counters within 1%; every activation has exactly
// one final; no event arrived twice; the sweeps stayed on time throughout;
// and the agent's counters say exactly what arrived and what was lost.
func TestIntegrationOTLPChurn(t *testing.T) {
	needCgroups(t)
	if testenv.InVMLane() {
		t.Skip("the VM lane's guest has no collector: the host's run holds this test")
	}
	// The collector's OTLP/gRPC on a Unix socket: a loopback port left
	// free through the outage could be taken by another process.
	col := testenv.StartCollector(t, testenv.WithCollectorSocket(filepath.Join(t.TempDir(), "otlp.sock")))
	c := startChurn(t, "--otlp-endpoint", "unix://"+col.Socket(), "--otlp-periodic-every", "1")
	daemons := []*testenv.Statsd{startStatsdIn(t, c.bin, c.dir, "a"), startStatsdIn(t, c.bin, c.dir, "b")}

	var recovered atomic.Bool
	var outage struct {
		sync.Mutex
		sweepsBefore, sweepsAfter float64
		took, slowest             time.Duration
	}
	var restartActor atomic.Value
	// The outage runs beside the lanes (not as a third parallel subtest:
	// go test runs at most GOMAXPROCS of them at once, 2 here). Its
	// t.Fatal, from this goroutine, ends only the goroutine; done is closed
	// by a defer either way.
	outageDone := make(chan struct{})
	go func() {
		defer close(outageDone)
		defer recovered.Store(true)
		time.Sleep(3 * time.Second)
		before := testenv.Scrape(t, c.agentURL)["sandboxstats_agent_sweeps_total{}"]
		start := time.Now()
		col.Stop(t)
		var slowest time.Duration // the longest sweep seen while the collector is down
		for time.Since(start) < otlpOutage {
			time.Sleep(200 * time.Millisecond)
			took := time.Duration(testenv.Scrape(t, c.agentURL)["sandboxstats_agent_last_sweep_duration_seconds{}"] * 1e9)
			slowest = max(slowest, took)
		}
		after := testenv.Scrape(t, c.agentURL)["sandboxstats_agent_sweeps_total{}"]
		col.Start(t)
		outage.Lock()
		outage.sweepsBefore, outage.sweepsAfter, outage.took, outage.slowest = before, after, time.Since(start), slowest
		outage.Unlock()
	}()
	t.Run("churn", func(t *testing.T) {
		lifetimes := []float64{0.25, 1, 3, 0.5, 2, 1.5, 4, 0.3, 2.5}
		for i, d := range daemons {
			t.Run(fmt.Sprint("statsd-", i), func(t *testing.T) {
				t.Parallel()
				for j := 0; ; j++ {
					actor := fmt.Sprintf("otlp-%d-%d", i, j)
					lifetime := time.Duration(lifetimes[(i*4+j)%len(lifetimes)] * float64(churnInterval))
					if i == 1 && j == 2 { // its statsd restarts right after its Checkpoint
						for try := range 3 {
							name := fmt.Sprintf("%s-try%d", actor, try)
							if c.activation(t, d, name, churnInterval, restartAfter) {
								restartActor.Store(name)
								break
							}
						}
						continue
					}
					c.activation(t, d, actor, lifetime, anytime)
					if recovered.Load() && j >= 4 {
						return
					}
				}
			})
		}
	})
	<-outageDone
	if t.Failed() {
		return
	}
	testenv.WaitNewSweeps(t, c.agentURL) // the last ends seen ...
	testenv.WaitNewSweeps(t, c.agentURL) // ... and charged, the events queued
	truth, n := c.truthSum()

	// What the agent says it sent and lost, once its queue is empty.
	var m map[string]float64
	var sent, dropped float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m = testenv.Scrape(t, c.agentURL)
		if m["sandboxstats_agent_otlp_queue_records{}"] == 0 || time.Now().After(deadline) {
			break
		}
	}
	var metricsFailed, logsRetried, resent float64
	for k, v := range m {
		switch {
		case strings.HasPrefix(k, "sandboxstats_agent_otlp_events_sent_total{"):
			sent += v
		case strings.HasPrefix(k, "sandboxstats_agent_otlp_events_dropped_total{"):
			dropped += v
		case k == `sandboxstats_agent_otlp_exports_total{result=failed,signal=metrics}`:
			metricsFailed = v
		case k == `sandboxstats_agent_otlp_exports_total{result=retry,signal=logs}`:
			logsRetried = v
		case strings.HasPrefix(k, "sandboxstats_agent_otlp_events_resent_total{"):
			resent += v
		}
	}
	arrived := col.WaitLogs(t, 30*time.Second, func(l []testenv.CollectedLog) bool { u, _ := dedupeByUID(l); return float64(len(u)) >= sent })
	logs, dups := dedupeByUID(arrived)
	finals, twice := finalsByActor(logs)
	t.Logf("the collector got %d events, %d of them again by uid (sent again after an export of unknown outcome: %.0f resent); the agent counted %.0f sent and %.0f dropped; during the outage %.0f metrics exports failed and %.0f event exports were kept to send again",
		len(arrived), dups, resent, sent, dropped, metricsFailed, logsRetried)
	if float64(len(logs)) != sent || float64(dups) > resent {
		t.Errorf("the collector got %d distinct events and %d again, the agent counted %.0f sent and %.0f sent again", len(logs), dups, sent, resent)
	}
	if len(twice) > 0 {
		t.Errorf("events that arrived twice: %v", twice)
	}
	if metricsFailed == 0 || logsRetried == 0 {
		t.Error("no metrics export failed, or no event export was kept, while the collector was down")
	}

	// One final per activation; their CPU, and the OTLP counter, equal the
	// cgroups' own.
	actors := c.actors()
	var finalCPU float64
	for _, a := range actors {
		switch f := finals[a]; len(f) {
		case 1:
			cpu, _ := f[0].Attributes["sandboxstats.stats.cpu.time"].(float64)
			finalCPU += cpu
		default:
			t.Errorf("%s: %d final events, want 1", a, len(f))
		}
	}
	if len(finals) != n {
		t.Errorf("final events of %d actors, %d activations", len(finals), n)
	}
	pts := col.WaitMetrics(t, 30*time.Second, func(p []testenv.CollectedPoint) bool {
		v, _ := latestCounter(p, "container.cpu.time", "sandboxstats.stats.source=cgroup")
		return within(v, truth, 0.01)
	})
	counter, sets := latestCounter(pts, "container.cpu.time", "sandboxstats.stats.source=cgroup")
	t.Logf("%d activations (%d finals): cgroups used %.3f CPU-s; final events' CPU %.3f (%.4f of it); container.cpu.time %.3f over %d attribute sets (%.4f)",
		n, len(finals), truth, finalCPU, finalCPU/truth, counter, sets, counter/truth)
	if !within(finalCPU, truth, 0.01) {
		t.Errorf("final events' CPU %.3f s, cgroups' own %.3f s: off by more than 1%%", finalCPU, truth)
	}
	for _, p := range pts {
		if p.Metric == "container.cpu.time" && (p.Unit != "s" || p.Temporality != "cumulative" || !p.Monotonic) {
			t.Fatalf("container.cpu.time: unit %q, %s, monotonic %v; want s, cumulative, monotonic", p.Unit, p.Temporality, p.Monotonic)
		}
	}
	if name, ok := restartActor.Load().(string); !ok {
		t.Error("in three tries, a sweep completed between the Checkpoint and the statsd restart each time")
	} else if len(finals[name]) != 1 {
		t.Errorf("the activation %s whose record reached the agent only from the restarted statsd: %d finals", name, len(finals[name]))
	}

	// Sweeps on time while the collector was down: about one an interval,
	// none slower than half a second.
	outage.Lock()
	during, slowest := outage.sweepsAfter-outage.sweepsBefore, outage.slowest
	outage.Unlock()
	t.Logf("outage %v: %.0f sweeps during it (interval %v); the longest sweep seen %v", outage.took.Round(time.Millisecond), during, churnInterval, slowest)
	if want := 0.8 * otlpOutage.Seconds() / churnInterval.Seconds(); during < want {
		t.Errorf("%.0f sweeps while the collector was down for %v, want at least %.0f", during, otlpOutage, want)
	}
	if slowest > 500*time.Millisecond {
		t.Errorf("a sweep took %v while the collector was down", slowest)
	}
}

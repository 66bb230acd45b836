package nodeagent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// hostileDaemons starts, in dir, a daemon answering 20,000 samples (each its
// own template and actor) and one answering a sample and 20,000 open drift
// findings (each its own actor).
func hostileDaemons(t *testing.T, dir string) {
	t.Helper()
	many := statsdfake.Start(t, filepath.Join(dir, "a-samples.sock"))
	var samples []*sandboxstatsv1.WorkloadStatsSample
	for i := range 20_000 {
		s := sample(fmt.Sprintf("a%05d", i), 1, 1)
		s.TemplateName = fmt.Sprintf("t%05d", i)
		s.OpenDriftFindings = 1
		samples = append(samples, s)
	}
	many.Set(samples...)
	many.SetDrift()
	findings := statsdfake.Start(t, filepath.Join(dir, "b-findings.sock"))
	s := sample("real", 1, 1)
	s.OpenDriftFindings = 1
	findings.Set(s)
	var fs []*sandboxstatsv1.DriftFinding
	for i := range 20_000 {
		fs = append(fs, &sandboxstatsv1.DriftFinding{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, ActorUid: fmt.Sprintf("f%05d", i)})
	}
	findings.SetDrift(fs...)
}

// countSeries returns how many sandboxstats_ series reg exports.
func countSeries(t *testing.T, reg prometheus.Gatherer) int {
	t.Helper()
	return len(gather(t, reg))
}

// TestHostileDaemonBounded: one daemon answering 20,000 samples and one
// answering 20,000 drift findings, with actor labels on (the worst case),
// must not grow the export by tens of thousands of series: each daemon's
// over-long part is dropped and counted.
func TestHostileDaemonBounded(t *testing.T) {
	dir := t.TempDir()
	hostileDaemons(t, dir)
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	results, err := sweep.Sweep(context.Background(), filepath.Join(dir, "*.sock"), 2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m.Apply(results, time.Now(), time.Millisecond)
	n := countSeries(t, reg)
	t.Logf("%d sandboxstats_ series after a sweep of the two hostile daemons", n)
	if n > 100 {
		t.Errorf("%d series exported for two daemons; want the over-long answers dropped (at most 100)", n)
	}
	// 20,000 full samples are over the reply's byte cap before their count
	// is (sweep's TestPollCaps has the count's cap with small samples).
	got := pick(gather(t, reg), metricRepliesCapped)
	want := map[string]float64{"{part=reply-bytes}": 1, "{part=drift-findings}": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", metricRepliesCapped, diff)
	}
}

// TestUnknownEnumsLabelledUnknown: enum values this build does not know (a
// newer or a hostile daemon's) are the label value "unknown", never a
// number and never a known value's name.
func TestUnknownEnumsLabelledUnknown(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	s := sample("w1", 1, 1)
	s.SandboxClass, s.Source = 99, 99
	m.Apply([]sweep.DaemonResult{
		{Socket: "1", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{s},
			DriftFindings: []*sandboxstatsv1.DriftFinding{{Kind: 99, ActorUid: "w1"}}},
		{Socket: "2", Status: sweep.StatusError, Code: codes.Code(99)},
	}, time.Now(), 0)
	all := gather(t, reg)
	for k := range all {
		if strings.Contains(k, "99") || strings.Contains(k, "=unspecified") || strings.Contains(k, "UNKNOWN") {
			t.Errorf("series %s: an unknown enum value must be the label value \"unknown\"", k)
		}
	}
	lUnknown := "{sandbox_class=unknown,source=unknown,template_name=python,template_namespace=templates}"
	for _, k := range []string{
		metricSampledWorkloads + lUnknown,
		metricDriftFindings + "{kind=unknown,sandbox_class=unknown,source=unknown,template_name=python,template_namespace=templates}",
		metricPollErrors + "{code=unknown}",
	} {
		if _, ok := all[k]; !ok {
			t.Errorf("no series %s in %v", k, all)
		}
	}
	// A source this build does not know measures a layer it cannot
	// compare: counted, never a number.
	if _, ok := all[metricMemoryCurrent+lUnknown]; ok {
		t.Errorf("memory exported for a sample of an unknown source")
	}
}

// TestDuplicateActorDropsBoth: a spoofing socket that sorts first reports
// the real actor with 1 PiB of memory. The agent cannot tell which daemon
// is right, so it exports neither sample and counts the conflict; the first
// socket never wins.
func TestDuplicateActorDropsBoth(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	spoof := sample("real", 1_000_000_000, 1<<50)
	spoof.EpochUnixNano++ // another epoch: a different activation, the same actor
	m.Apply([]sweep.DaemonResult{
		okResult("/run/statsd/a-spoof.sock", spoof),
		okResult("/run/statsd/b-real.sock", sample("real", 1_000, 64<<20)),
		okResult("/run/statsd/c-other.sock", sample("other", 1_000, 32<<20)),
	}, time.Now(), 0)
	all := gather(t, reg)
	want := map[string]float64{
		"{actor_name=other-name,actor_namespace=team-a,actor_uid=other,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 32 << 20,
	}
	if diff := cmp.Diff(want, pick(all, metricMemoryCurrent)); diff != "" {
		t.Errorf("memory (-want +got):\n%s", diff)
	}
	if got := all[metricActorConflicts+"{}"]; got != 1 {
		t.Errorf("%s = %v, want 1", metricActorConflicts, got)
	}
}

// TestSweepBounded: 24 daemons that accept and never answer, one slot, a
// 1 s timeout: without a bound on the whole sweep it would take 24 s. The
// sweep ends within its bound (by default the interval); the daemons it had
// no time for are "skipped".
func TestSweepBounded(t *testing.T) {
	dir := t.TempDir()
	for i := range 24 {
		statsdfake.Start(t, filepath.Join(dir, fmt.Sprintf("h%02d.sock", i))).Hang()
	}
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: 2 * time.Second, Timeout: time.Second, Concurrency: 1, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	results := a.SweepOnce(context.Background())
	took := time.Since(start)
	t.Logf("sweep of 24 hung daemons (1 slot, 1 s timeout, 2 s interval) took %v", took)
	if took > 3500*time.Millisecond {
		t.Errorf("sweep took %v; want it bounded by the 2 s interval", took)
	}
	if len(results) != 24 {
		t.Fatalf("%d results, want one per daemon", len(results))
	}
	counts := map[sweep.Status]int{}
	for _, r := range results {
		counts[r.Status]++
	}
	if counts[sweep.StatusSkipped] == 0 || counts[sweep.StatusError] == 0 {
		t.Errorf("outcomes %v: want some polls that timed out and the rest skipped", counts)
	}
}

// TestLongActorUIDConflicts: an actor uid longer than the 253-byte key cut
// (no statsd sends one) is checked for conflicts by the same key its
// activation is accounted under: an activation sampled from one socket and
// then reported by another is believed from neither, and two distinct
// long uids sharing their first 253 bytes are two accounts.
func TestLongActorUIDConflicts(t *testing.T) {
	long := func(last byte) string { return strings.Repeat("u", 299) + string(last) }
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	t.Run("one long uid from two sockets", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 4}, discard())
		if err != nil {
			t.Fatal(err)
		}
		m.Apply([]sweep.DaemonResult{okResult("a.sock", sample(long('x'), 1_000_000, 1))}, t0, 0)
		m.Apply([]sweep.DaemonResult{okResult("a.sock", sample(long('x'), 2_000_000, 1))}, t0.Add(time.Minute), 0) // +1 s
		// Another socket reports the same activation: neither is believed.
		m.Apply([]sweep.DaemonResult{
			okResult("a.sock", sample(long('x'), 3_000_000, 1)),
			okResult("b.sock", sample(long('x'), 60_000_000, 1)),
		}, t0.Add(2*time.Minute), 0)
		// Only the impostor reports it: not believed either.
		m.Apply([]sweep.DaemonResult{okResult("b.sock", sample(long('x'), 120_000_000, 1))}, t0.Add(3*time.Minute), 0)
		got := gather(t, reg)
		if diff := cmp.Diff(map[string]float64{lCgroup: 1}, pick(got, metricCPUSeconds), approx()); diff != "" {
			t.Errorf("the template's CPU: only the first socket's 1 s before the conflict (-want +got):\n%s", diff)
		}
		if n := got[metricActorConflicts+"{}"]; n != 2 {
			t.Errorf("%s = %v, want 2 (one a sweep)", metricActorConflicts, n)
		}
	})
	t.Run("two long uids sharing their cut", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 4}, discard())
		if err != nil {
			t.Fatal(err)
		}
		m.Apply([]sweep.DaemonResult{okResult("a.sock", sample(long('x'), 1_000_000, 1), sample(long('y'), 100_000_000, 1))}, t0, 0)
		m.Apply([]sweep.DaemonResult{okResult("a.sock", sample(long('x'), 2_000_000, 1), sample(long('y'), 103_000_000, 1))}, t0.Add(time.Minute), 0)
		got := gather(t, reg)
		if diff := cmp.Diff(map[string]float64{lCgroup: 4}, pick(got, metricCPUSeconds), approx()); diff != "" {
			t.Errorf("the template's CPU: 1 s + 3 s (-want +got):\n%s", diff)
		}
		if n := got[metricActorConflicts+"{}"]; n != 0 {
			t.Errorf("%s = %v, want 0", metricActorConflicts, n)
		}
	})
}

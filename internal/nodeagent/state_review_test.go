package nodeagent

// Hostile tests of --state-dir (issue 30's review): a restart with other
// flags than the state was written with, a shutdown save that fails, a
// foreign file's pending events, and the cost of a save.

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// newFlaggedHarness is newStatefulHarness with actor and interface labels
// as given.
func newFlaggedHarness(t *testing.T, dir string, now time.Time, labelActor, labelInterface bool) *statefulHarness {
	t.Helper()
	h := &otelHarness{reg: prometheus.NewPedanticRegistry(), reader: sdkmetric.NewManualReader(), events: &recordingProcessor{}}
	cfg := metricsConfig{Grace: 5 * time.Minute, CPUs: 2, LabelActor: labelActor, LabelInterface: labelInterface, Started: now, OTel: &OTel{
		Meters:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader)),
		Loggers: sdklog.NewLoggerProvider(sdklog.WithProcessor(h.events)),
	}}
	log := &syncBuffer{}
	m, err := newStatefulMetrics(h.reg, cfg, dir, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	return &statefulHarness{otelHarness: h, log: log}
}

// sumMetric sums every series of metric name in reg, failing the test
// when reg cannot be gathered (a scrape would fail).
func sumMetric(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	var sum float64
	for k, v := range gather(t, reg) {
		if strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

// TestStateLabelFlagsToggled: an agent restarted with --label-actor or
// --label-interface changed from the run that wrote its state still
// serves a scrape (no series served twice), and charges nothing twice:
// the usage while it was down is charged once under the labels it is now
// exported under; the network counters that changed form start again
// from their next sample (the bytes while down are not charged: there is
// no account of the new form to continue), never their head again.
func TestStateLabelFlagsToggled(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name                        string
		actorBefore, actorAfter     bool
		interfaceBefore, ifaceAfter bool
		// wantRx: the bytes received charged at the first sweep after the
		// restart, summed over the series: the 3 MB each workload got while
		// the agent was down, once; none when the network counters
		// changed form (their accounts of the other form cannot be
		// continued: they start again, never charge the head twice).
		wantRx float64
	}{
		{"label-actor on then off", true, false, false, false, 2 * 3_000_000},
		{"label-actor off then on", false, true, false, false, 2 * 3_000_000},
		{"label-interface on then off", false, false, true, false, 0},
		{"label-interface off then on", false, false, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			epoch := t0.Add(time.Second)
			sweepOf := func(at time.Time, cpu uint64) []sweep.DaemonResult {
				// Two workloads of one template, sampled by one daemon.
				return []sweep.DaemonResult{okResult("s", signalSample("a", epoch, at, cpu), signalSample("b", epoch, at, cpu))}
			}
			first := newFlaggedHarness(t, dir, t0, tc.actorBefore, tc.interfaceBefore)
			for i, cpu := range []uint64{1_000_000, 2_000_000} {
				at := t0.Add(time.Duration(10*(i+1)) * time.Second)
				first.m.Apply(sweepOf(at, cpu), at, time.Millisecond)
			}
			cpuBefore := sumMetric(t, first.reg, metricCPUSeconds)
			rxBefore := sumMetric(t, first.reg, "sandboxstats_workload_network_receive_bytes_total")

			second := newFlaggedHarness(t, dir, t0.Add(time.Minute), tc.actorAfter, tc.ifaceAfter)
			at := t0.Add(70 * time.Second)
			second.m.Apply(sweepOf(at, 5_000_000), at, time.Millisecond)
			if _, err := second.reg.Gather(); err != nil {
				t.Fatalf("a scrape of the restarted agent fails: %v", err)
			}
			cpuAfter := sumMetric(t, second.reg, metricCPUSeconds)
			rxAfter := sumMetric(t, second.reg, "sandboxstats_workload_network_receive_bytes_total")
			// Each workload used 5 s and received 5 MB (the signal sample's
			// rx is its CPU value), eth0 and eth1 together.
			if cpuBefore != 4 || cpuAfter != 10 {
				t.Errorf("CPU summed over the series: %v before the restart (want 4), %v after (want 10)", cpuBefore, cpuAfter)
			}
			if got := rxAfter - rxBefore; tc.wantRx != 0 && got != tc.wantRx {
				t.Errorf("bytes received charged across the restart: %v, want %v; before %v, after %v", got, tc.wantRx, rxBefore, rxAfter)
			}
			if tc.wantRx == 0 && rxAfter != 0 {
				t.Errorf("bytes received after the restart, the counters' form changed: %v, want 0 (charged from the next sample on, not the head again)", rxAfter)
			}
			// The sweep after: 1 MB more each, charged.
			at = t0.Add(80 * time.Second)
			second.m.Apply(sweepOf(at, 6_000_000), at, time.Millisecond)
			if got := sumMetric(t, second.reg, "sandboxstats_workload_network_receive_bytes_total") - rxAfter; got != 2*1_000_000 {
				t.Errorf("bytes received at the next sweep: %v, want %v", got, 2*1_000_000)
			}
		})
	}
}

// TestStateShutdownSaveFailureKeepsLastSweep: the shutdown save (SaveState)
// only adds what the pipeline settled since the last sweep; when it fails
// the last sweep's file, in step with what was served, must stay: removing
// it makes the restart a first start that loses the whole state.
func TestStateShutdownSaveFailureKeepsLastSweep(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	h := newStatefulHarness(t, dir, t0)
	at := t0.Add(10 * time.Second)
	h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", t0.Add(time.Second), at, 1_000_000))}, at, time.Millisecond)
	// The shutdown save fails (a full disk, EIO).
	h.m.state.write = func(string, string, []byte, os.FileMode) error { return os.ErrPermission }
	a := &Agent{metrics: h.m}
	a.SaveState()
	if _, err := os.Stat(filepath.Join(dir, agentStateFile)); err != nil {
		t.Errorf("the last sweep's state is gone after a failed shutdown save: %v", err)
	}
	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	at = t0.Add(70 * time.Second)
	second.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", t0.Add(time.Second), at, 5_000_000))}, at, time.Millisecond)
	if got := cpuTotals(t, second.otelHarness)["a"]; got != 5 {
		t.Errorf("a's CPU after the restart: %v, want 5 (continued from the last sweep's state)", got)
	}
}

// TestStateForeignPendingSettles: a pending event whose uid is not its
// record's log.record.uid (a foreign or hand-edited file) would never be
// settled by the pipeline, which settles by the record's attribute: it
// would be sent again at every restart, for ever. Such a file is foreign:
// set aside whole, like a counter this build does not know.
func TestStateForeignPendingSettles(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	writeGood := newStatefulHarness(t, dir, t0)
	at := t0.Add(10 * time.Second)
	writeGood.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", t0.Add(time.Second), at, 1_000_000))}, at, time.Millisecond)
	p := filepath.Join(dir, agentStateFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// The file's pending initial, its uid changed (the attribute kept).
	i := strings.Index(string(b), `"pending_events":[{"uid":"`)
	if i < 0 {
		t.Fatalf("no pending event in %s", b)
	}
	i += len(`"pending_events":[{"uid":"`)
	b = append(append(append([]byte{}, b[:i]...), []byte("forged")...), b[i+32:]...)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	second.m.resendPending(t0.Add(time.Minute))
	// The pipeline settles every record it got, by its attribute.
	for _, r := range second.events.records() {
		second.m.pending.settle([]string{eventAttr(r, attrRecordUID)})
	}
	if evs, _ := second.m.pending.list(); len(evs) != 0 {
		t.Errorf("pending after the pipeline settled every record it was given: %d (uid %q): sent again at every restart", len(evs), evs[0].UID)
	}
	if !strings.Contains(second.log.String(), "moved aside") {
		t.Errorf("the foreign file is not set aside:\n%s", second.log.String())
	}
}

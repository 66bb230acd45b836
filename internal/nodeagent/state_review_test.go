package nodeagent

// Hostile tests of --state-dir (issue 30's review): a restart with other
// flags than the state was written with, a shutdown save that fails, a
// foreign file's pending events, and the cost of a save.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// newFlaggedHarness is newStatefulHarness with actor and interface labels
// as given.
func newFlaggedHarness(t *testing.T, dir string, now time.Time, labelActor, labelInterface bool) *statefulHarness {
	t.Helper()
	return newConfiguredHarness(t, dir, now, func(c *metricsConfig) { c.LabelActor, c.LabelInterface = labelActor, labelInterface })
}

// newConfiguredHarness is newStatefulHarness without actor labels, its
// configuration then changed by set.
func newConfiguredHarness(t *testing.T, dir string, now time.Time, set func(*metricsConfig)) *statefulHarness {
	t.Helper()
	dists := NewDistributions()
	h := &otelHarness{reg: prometheus.NewPedanticRegistry(), reader: sdkmetric.NewManualReader(sdkmetric.WithProducer(dists)), events: &recordingProcessor{}}
	cfg := metricsConfig{Grace: 5 * time.Minute, CPUs: 2, Started: now, OTel: &OTel{
		Meters:        sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader)),
		Loggers:       sdklog.NewLoggerProvider(sdklog.WithProcessor(h.events)),
		Distributions: dists,
	}}
	set(&cfg)
	log := &testenv.SyncBuffer{}
	m, err := newStatefulMetrics(h.reg, cfg, dir, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	return &statefulHarness{otelHarness: h, log: log}
}

// applyOne applies a sweep at at of one daemon sampling actor (epoch
// begun at epoch) with cpu µs of CPU.
func applyOne(h *statefulHarness, actor string, epoch, at time.Time, cpu uint64) {
	h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample(actor, epoch, at, cpu))}, at, time.Millisecond)
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
	applyOne(h, "a", t0.Add(time.Second), at, 1_000_000)
	// The shutdown save fails (a full disk, EIO).
	h.m.state.write = func(string, string, []byte, os.FileMode) error { return os.ErrPermission }
	a := &Agent{metrics: h.m}
	a.SaveState()
	if _, err := os.Stat(filepath.Join(dir, agentStateFile)); err != nil {
		t.Errorf("the last sweep's state is gone after a failed shutdown save: %v", err)
	}
	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	at = t0.Add(70 * time.Second)
	applyOne(second, "a", t0.Add(time.Second), at, 5_000_000)
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
	applyOne(writeGood, "a", t0.Add(time.Second), at, 1_000_000)
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

// TestStateTemplateSlots: the templates exported by name keep their slots
// across a restart: with --max-templates 1, a template that had the slot
// before keeps its usage under its name after, instead of the first
// template sampled after the restart taking the slot (its usage then
// under its own name while the other's goes to (other): two templates
// named at once, past the bound, and each template's usage moved).
func TestStateTemplateSlots(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	of := func(tmpl, actor string, at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		s := signalSample(actor, t0.Add(time.Second), at, cpu)
		s.TemplateName = tmpl
		return s
	}
	maxOne := func(c *metricsConfig) { c.MaxTemplates = 1 }
	first := newConfiguredHarness(t, dir, t0, maxOne)
	for i, cpu := range []uint64{1_000_000, 2_000_000} {
		at := t0.Add(time.Duration(10*(i+1)) * time.Second)
		first.m.Apply([]sweep.DaemonResult{okResult("s", of("alpha", "a", at, cpu)), okResult("t", of("beta", "b", at, cpu))}, at, time.Millisecond)
	}
	second := newConfiguredHarness(t, dir, t0.Add(time.Minute), maxOne)
	at := t0.Add(70 * time.Second)
	// beta's daemon answers first now.
	second.m.Apply([]sweep.DaemonResult{okResult("t", of("beta", "b", at, 5_000_000)), okResult("s", of("alpha", "a", at, 5_000_000))}, at, time.Millisecond)
	got := map[string]float64{}
	for k, v := range gather(t, second.reg) {
		if strings.HasPrefix(k, metricCPUSeconds+"{") {
			i := strings.Index(k, "template_name=") + len("template_name=")
			got[k[i:strings.IndexAny(k[i:], ",}")+i]] = v
		}
	}
	want := map[string]float64{"alpha": 5, otherTemplate: 5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CPU by template after the restart (-want +got):\n%s", diff)
	}
}

// TestStateSaveCost measures the save every sweep makes, with 1000 live
// activations and --label-actor (the agent's documented scale): the
// file's size and the time of one save (export, JSON, the atomic write
// with its two fsyncs), logged (go test -v). The bound is loose (a loaded
// machine): a save must stay well under a 1 s interval.
func TestStateSaveCost(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	h := newStatefulHarness(t, dir, t0)
	const n = 1000
	sweepOf := func(at time.Time, cpu uint64) []sweep.DaemonResult {
		ss := make([]*sandboxstatsv1.WorkloadStatsSample, n)
		for i := range ss {
			ss[i] = signalSample(fmt.Sprintf("actor-%04d-%s", i, strings.Repeat("u", 24)), t0.Add(time.Second), at, cpu)
		}
		return []sweep.DaemonResult{okResult("s", ss...)}
	}
	for i, cpu := range []uint64{1_000_000, 2_000_000} {
		at := t0.Add(time.Duration(10*(i+1)) * time.Second)
		h.m.Apply(sweepOf(at, cpu), at, time.Millisecond)
	}
	fi, err := os.Stat(filepath.Join(dir, agentStateFile))
	if err != nil {
		t.Fatal(err)
	}
	withPending := fi.Size()
	// The collector took the initials: the usual state.
	evs, _ := h.m.pending.list()
	for _, ev := range evs {
		h.m.pending.settle([]string{ev.UID})
	}
	const saves = 5
	var export, marshal, write time.Duration
	for range saves {
		start := time.Now()
		h.m.mu.Lock()
		st := h.m.exportState(t0.Add(30 * time.Second))
		h.m.mu.Unlock()
		e := time.Now()
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		mm := time.Now()
		if err := atomicfile.Write(dir, agentStateFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
		export, marshal, write = export+e.Sub(start), marshal+mm.Sub(e), write+time.Since(mm)
	}
	per := (export + marshal + write) / saves
	if fi, err = os.Stat(filepath.Join(dir, agentStateFile)); err != nil {
		t.Fatal(err)
	}
	t.Logf("state of %d live activations (--label-actor): %d bytes (%d per activation; %d with their initials pending); one save %v (export %v, JSON %v, write+fsync %v); %.2f%% of a 60 s interval, %.1f%% of 1 s",
		n, fi.Size(), fi.Size()/n, withPending, per, export/saves, marshal/saves, write/saves, 100*per.Seconds()/60, 100*per.Seconds())
	if per > 500*time.Millisecond {
		t.Errorf("one save takes %v with %d activations", per, n)
	}
}

// daemonSetMemoryLimit is the statsagent container's memory limit in
// deploy/kubernetes/daemonset.yaml.
const daemonSetMemoryLimit = 128 << 20

// TestStateLoadMemory: reading the state file must fit the agent's memory
// limit up to maxAgentStateBytes, or a large file (foreign, or a real one
// after a long Collector outage) OOM-kills the agent at every start
// before it can be set aside: a crash loop. Measured on an 8 MiB file of
// pending events: the load's peak heap per byte of file, scaled to the
// cap.
func TestStateLoadMemory(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	st := agentState{Version: agentStateVersion, OriginUnixNano: t0.UnixNano(), SavedUnixNano: t0.UnixNano()}
	for i := 0; ; i++ {
		uid := fmt.Sprintf("%032x", i)
		st.Pending = append(st.Pending, pendingEvent{UID: uid, TimeUnixNano: t0.UnixNano(), Attrs: []storedAttr{
			{Key: string(attrRecordUID), Type: "s", S: uid}, {Key: string(attrKind), Type: "s", S: KindFinal},
			{Key: string(attrActorUID), Type: "s", S: strings.Repeat("u", 36)}, {Key: "sandboxstats.cpu.usec", Type: "i", I: 123456}}})
		if i%1000 == 0 {
			if b, _ := json.Marshal(st); len(b) > 8<<20 {
				break
			}
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, agentStateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	st, b = agentState{}, nil
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	fi, err := os.Stat(filepath.Join(dir, agentStateFile))
	if err != nil {
		t.Fatal(err)
	}
	h := newStatefulHarness(t, dir, t0.Add(time.Minute))
	close(stop)
	<-done
	if !strings.Contains(h.log.String(), "agent state restored") {
		t.Fatalf("the file was not loaded:\n%s", h.log.String())
	}
	perByte := float64(peak.Load()-before.HeapInuse) / float64(fi.Size())
	atCap := perByte * maxAgentStateBytes
	t.Logf("a %d-byte state file took %.1f bytes of heap per byte to load: %.0f MiB at the %d MiB cap", fi.Size(), perByte, atCap/(1<<20), maxAgentStateBytes>>20)
	if atCap > daemonSetMemoryLimit {
		t.Errorf("loading a state file at the cap takes about %.0f MiB of heap, past the DaemonSet's %d MiB limit", atCap/(1<<20), daemonSetMemoryLimit>>20)
	}
}

// TestStateSymlinkNotFollowed: a symlink at agent-state.json (planted, or
// left by a tool) is neither read nor written through: it is set aside,
// the agent starts as a first start, and the file it points to is left
// alone; the state written is a regular file of mode 0600 in a directory
// of mode 0700.
func TestStateSymlinkNotFollowed(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	good := t.TempDir()
	b := writeGoodState(t, good)
	target := filepath.Join(good, agentStateFile)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, agentStateFile)); err != nil {
		t.Fatal(err)
	}
	h := newStatefulHarness(t, dir, t0.Add(time.Hour))
	if !h.m.cfg.Started.Equal(t0.Add(time.Hour)) || !strings.Contains(h.log.String(), "moved aside") {
		t.Errorf("a symlinked state file was followed (start %v):\n%s", h.m.cfg.Started, h.log.String())
	}
	at := t0.Add(time.Hour + 10*time.Second)
	applyOne(h, "a", faultT0.Add(time.Second), at, 9_000_000)
	if after, err := os.ReadFile(target); err != nil || string(after) != string(b) {
		t.Errorf("the symlink's target was changed (err %v)", err)
	}
	fi, err := os.Lstat(filepath.Join(dir, agentStateFile))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("state written: %v, err %v; want a regular file of mode 0600", fi.Mode(), err)
	}
	fresh := filepath.Join(t.TempDir(), "new", "state")
	newStatefulHarness(t, fresh, t0)
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir made: %v, err %v; want mode 0700", fi.Mode(), err)
	}
}

// TestStateSettledConcurrently: the pipeline settles events from its own
// goroutines (and from inside an emit, its queue full) while sweeps apply
// and save, the previous process's events are sent again and the agent
// saves at shutdown: no deadlock, no race (go test -race).
func TestStateSettledConcurrently(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	var agent atomic.Pointer[Agent]
	// Every other event is settled at once, from inside Emit, as a full
	// queue does (the emitter holds the sweep's lock there).
	sp := &settlingProcessor{settle: func(uid string) {
		if a := agent.Load(); a != nil {
			a.Settled([]string{uid})
		}
	}}
	h := newConfiguredHarness(t, dir, t0, func(c *metricsConfig) {
		c.LabelActor = true
		c.OTel.Loggers = sdklog.NewLoggerProvider(sdklog.WithProcessor(sp))
	})
	a := &Agent{metrics: h.m}
	agent.Store(a)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, r := range sp.records() {
				a.Settled([]string{eventAttr(r, attrRecordUID)})
			}
			a.SaveState()
		}
	}()
	go func() {
		defer wg.Done()
		h.m.resendPending(t0)
	}()
	for i := range 50 {
		at := t0.Add(time.Duration(10*(i+1)) * time.Second)
		h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample(fmt.Sprintf("w%d", i), t0.Add(time.Second), at, uint64(i)*1000))}, at, time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for _, r := range sp.records() {
		a.Settled([]string{eventAttr(r, attrRecordUID)})
	}
	a.SaveState()
	if evs, _ := h.m.pending.list(); len(evs) != 0 || len(sp.records()) < 50 {
		t.Errorf("%d events left pending of %d emitted, every one settled", len(evs), len(sp.records()))
	}
}

// settlingProcessor records the events and settles every other one from
// inside OnEmit.
type settlingProcessor struct {
	recordingProcessor
	settle func(uid string)
	n      atomic.Int64
}

func (p *settlingProcessor) OnEmit(ctx context.Context, r *sdklog.Record) error {
	_ = p.recordingProcessor.OnEmit(ctx, r)
	if p.n.Add(1)%2 == 0 {
		r.WalkAttributes(func(kv attribute.KeyValue) bool {
			if kv.Key == attrRecordUID {
				p.settle(kv.Value.AsString())
			}
			return true
		})
	}
	return nil
}

// TestStateHostileFiles: a foreign state file (deep JSON, NaN, negative
// numbers, duplicate keys and entries, a label past the cut, times in the
// future, a huge attribute) never crashes the agent: it is set aside or
// continued from, and the next sweep is served.
func TestStateHostileFiles(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	origin := strconv.FormatInt(t0.UnixNano(), 10)
	for _, tc := range []struct {
		name, file string
		continued  bool
	}{
		{"deep", `{"version":1,"origin_unix_nano":` + origin + `,"totals":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, false},
		{"NaN", `{"version":1,"origin_unix_nano":` + origin + `,"pending_events":[{"uid":"u","attributes":[{"k":"x","t":"f","f":NaN}]}]}`, false},
		{"negative total", `{"version":1,"origin_unix_nano":` + origin + `,"totals":[{"labels":["a","b","c","d","","",""],"counters":[{"counter":0,"value":-5}]}]}`, false},
		{"negative counter", `{"version":1,"origin_unix_nano":` + origin + `,"accountant":{"live":[{"key":{"actor_uid":"a"},"counters":[{"counter":-1,"last":1}]}]}}`, false},
		{"negative origin", `{"version":1,"origin_unix_nano":-1}`, false},
		{"duplicate keys", `{"version":1,"version":1,"origin_unix_nano":1,"origin_unix_nano":` + origin + `}`, true},
		{"duplicate owners and marks", `{"version":1,"origin_unix_nano":` + origin + `,"owners":[{"key":{"actor_uid":"a"},"socket":"s"},{"key":{"actor_uid":"a"},"socket":"t"}],"ended_marks":[{"socket":"s","instance_id":"i","highest_sequence":5},{"socket":"s","instance_id":"j","highest_sequence":18446744073709551615}]}`, true},
		{"duplicate totals", `{"version":1,"origin_unix_nano":` + origin + `,"totals":[{"labels":["a","b","c","d","","",""],"counters":[]},{"labels":["a","b","c","d","","",""],"counters":[]}]}`, false},
		{"label past the cut", `{"version":1,"origin_unix_nano":` + origin + `,"totals":[{"labels":["` + strings.Repeat("x", 300) + `","b","c","d","","",""],"counters":[]}]}`, false},
		{"invalid UTF-8 label", "{\"version\":1,\"origin_unix_nano\":" + origin + ",\"totals\":[{\"labels\":[\"\xff\",\"b\",\"c\",\"d\",\"\",\"\",\"\"],\"counters\":[{\"counter\":0,\"value\":5}]}]}", true},
		{"ended charged in the future", `{"version":1,"origin_unix_nano":` + origin + `,"accountant":{"ended":[{"key":{"actor_uid":"a"},"charged_unix_nano":9223372036854775807}]}}`, true},
		{"huge attribute", `{"version":1,"origin_unix_nano":` + origin + `,"pending_events":[{"uid":"u","attributes":[{"k":"log.record.uid","t":"s","s":"u"},{"k":"sandboxstats.stats.kind","t":"s","s":"final"},{"k":"x","t":"s","s":"` + strings.Repeat("y", 8<<20) + `"}]}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, agentStateFile), []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			h := newStatefulHarness(t, dir, t0.Add(time.Hour))
			if got := h.m.cfg.Started.Equal(t0); got != tc.continued {
				t.Errorf("continued from the file: %v, want %v:\n%s", got, tc.continued, h.log.String())
			}
			h.m.resendPending(t0.Add(time.Hour))
			at := t0.Add(time.Hour + 10*time.Second)
			applyOne(h, "a", t0.Add(time.Second), at, 1_000_000)
			if _, err := h.reg.Gather(); err != nil {
				t.Errorf("scrape after the restart: %v", err)
			}
		})
	}
}

// TestStateSetAsideLoses: what a restart whose state file is set aside
// (corrupt) loses, as its log says: an activation that ended while no
// agent ran, its record still held by statsd, is neither charged nor sent
// a final (it ended before this agent's start, a first start's rule: a
// previous agent may have charged it). The log used to say such finals
// are sent.
func TestStateSetAsideLoses(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	if err := os.WriteFile(filepath.Join(dir, agentStateFile), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newStatefulHarness(t, dir, t0.Add(time.Minute))
	s := signalSample("c", t0.Add(10*time.Second), t0.Add(20*time.Second), 700_000)
	end := endedOf(s, t0.Add(30*time.Second), 700_000)
	at := t0.Add(70 * time.Second)
	h.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Ended: []*sandboxstatsv1.EndedActivation{end}}}, at, time.Millisecond)
	kinds, _ := eventUIDs(h.otelHarness)
	if len(kinds) != 0 {
		t.Errorf("events after the set-aside restart: %v, want none (the record ended before this agent's start)", kinds)
	}
	if logged := h.log.String(); strings.Contains(logged, "finals of records statsd still holds are sent") || !strings.Contains(logged, "ended then, are neither charged nor sent") {
		t.Errorf("the log does not say what is lost:\n%s", logged)
	}
}

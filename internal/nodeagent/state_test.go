package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// statefulHarness is an otelHarness whose metrics keep their state in dir,
// made at now as statsagent --state-dir makes them; log is its log.
type statefulHarness struct {
	*otelHarness
	log *testenv.SyncBuffer
}

func newStatefulHarness(t *testing.T, dir string, now time.Time) *statefulHarness {
	t.Helper()
	return newConfiguredHarness(t, dir, now, func(c *metricsConfig) { c.LabelActor = true })
}

// cpuTotals returns the exported CPU counter by actor.
func cpuTotals(t *testing.T, h *otelHarness) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range gather(t, h.reg) {
		if strings.HasPrefix(k, metricCPUSeconds+"{") {
			i := strings.Index(k, "actor_uid=") + len("actor_uid=")
			out[k[i:i+1]] = v
		}
	}
	return out
}

// eventUIDs returns each event's kind and actor, in order, and how many
// times each uid was emitted.
func eventUIDs(h *otelHarness) (kinds []string, sends map[string]int) {
	sends = map[string]int{}
	for _, r := range h.events.records() {
		kinds = append(kinds, eventAttr(r, attrKind)+" "+eventAttr(r, attrActorUID))
		sends[eventAttr(r, attrRecordUID)]++
	}
	return kinds, sends
}

// TestStateAcrossRestart: an agent restarted with its state directory
// continues every CPU counter from what it had charged (never lower than
// what was served), charges the usage while it was down at its first sweep
// and the records that ended then, sends again the events not settled
// (same uids), sends no initial twice, and counts a gap in a daemon's
// sequences across the restart.
func TestStateAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	a := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		return signalSample("a", t0.Add(time.Second), at, cpu)
	}
	b := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		return signalSample("b", t0.Add(2*time.Second), at, cpu)
	}
	log := &sandboxstatsv1.EndedLog{InstanceId: "i1", LowestSequence: 1, NextSequence: 1}

	first := newStatefulHarness(t, dir, t0)
	first.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{
		a(t0.Add(10*time.Second), 1_000_000), b(t0.Add(10*time.Second), 500_000)}, EndedLog: log}}, t0.Add(10*time.Second), time.Millisecond)
	// The collector takes a's initial; b's is still queued when the agent
	// is killed (after its next sweep's state was saved).
	for _, r := range first.events.records() {
		if eventAttr(r, attrActorUID) == "a" {
			first.m.pending.settle([]string{eventAttr(r, attrRecordUID)})
		}
	}
	first.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{
		a(t0.Add(20*time.Second), 2_000_000), b(t0.Add(20*time.Second), 600_000)}, EndedLog: log}}, t0.Add(20*time.Second), time.Millisecond)
	before := cpuTotals(t, first.otelHarness)

	// Down from 0:20 to 1:00: a ran on, b ended at 0:50 (sequence 3; 1
	// and 2 were dropped unread), and c began and ended while no agent ran
	// (sequence 4).
	second := newStatefulHarness(t, dir, t0.Add(time.Minute))
	second.m.resendPending(t0.Add(time.Minute))
	endB := endedOf(b(t0.Add(50*time.Second), 900_000), t0.Add(50*time.Second), 900_000)
	endB.InstanceId, endB.Sequence = "i1", 3
	c := signalSample("c", t0.Add(30*time.Second), t0.Add(40*time.Second), 700_000)
	endC := endedOf(c, t0.Add(40*time.Second), 700_000)
	endC.InstanceId, endC.Sequence = "i1", 4
	second.m.Apply([]sweep.DaemonResult{{Socket: "s", Status: sweep.StatusOK,
		Samples:  []*sandboxstatsv1.WorkloadStatsSample{a(t0.Add(70*time.Second), 5_000_000)},
		Ended:    []*sandboxstatsv1.EndedActivation{endB, endC},
		EndedLog: &sandboxstatsv1.EndedLog{InstanceId: "i1", LowestSequence: 3, NextSequence: 5}}}, t0.Add(70*time.Second), time.Millisecond)
	after := cpuTotals(t, second.otelHarness)

	if diff := cmp.Diff(map[string]float64{"a": 2, "b": 0.6}, before); diff != "" {
		t.Errorf("CPU before the kill (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"a": 5, "b": 0.9, "c": 0.7}, after, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("CPU after the restart: the usage while down charged, counters continued (-want +got):\n%s", diff)
	}
	kinds, _ := eventUIDs(second.otelHarness)
	if diff := cmp.Diff([]string{"initial b", "lost ", "final b", "final c"}, kinds); diff != "" {
		t.Errorf("events of the restarted agent: b's unsettled initial again, no initial of a, the gap, the finals (-want +got):\n%s", diff)
	}
	if again, first := eventAttr(second.events.records()[0], attrRecordUID), eventAttr(first.events.records()[1], attrRecordUID); again != first {
		t.Errorf("b's initial sent again with uid %s, first sent with %s", again, first)
	}
	if got := gather(t, second.reg)[metricEndedLost+"{}"]; got != 2 {
		t.Errorf("records lost across the restart: %v, want 2 (sequences 1 and 2)", got)
	}
	if !strings.Contains(second.log.String(), "agent state restored") {
		t.Errorf("the restart does not say it continued:\n%s", second.log.String())
	}
}

// faultT0 is when the first agent of the fault tests started.
var faultT0 = time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)

// writeGoodState leaves in dir the state of an agent that charged actor
// "a" 2 s of CPU over two sweeps, and returns the file's bytes.
func writeGoodState(t *testing.T, dir string) []byte {
	t.Helper()
	h := newStatefulHarness(t, dir, faultT0)
	for i, cpu := range []uint64{1_000_000, 2_000_000} {
		at := faultT0.Add(time.Duration(10*(i+1)) * time.Second)
		h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", faultT0.Add(time.Second), at, cpu))}, at, time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(dir, agentStateFile))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

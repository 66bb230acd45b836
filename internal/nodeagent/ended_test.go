package nodeagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// endedOf returns the record of s's activation ending at end with own CPU
// cpuUsec, read at the end.
func endedOf(s *sandboxstatsv1.WorkloadStatsSample, end time.Time, cpuUsec uint64) *sandboxstatsv1.EndedActivation {
	final := proto.Clone(s).(*sandboxstatsv1.WorkloadStatsSample)
	final.CpuUsageUsec = proto.Uint64(cpuUsec)
	return &sandboxstatsv1.EndedActivation{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: s.GetActorUid(), ActorName: s.GetActorName(), ActorNamespace: s.GetActorNamespace(),
			TemplateNamespace: s.GetTemplateNamespace(), TemplateName: s.GetTemplateName()},
		SandboxClass: s.GetSandboxClass(), Source: s.GetSource(),
		EpochUnixNano: s.GetEpochUnixNano(), EndUnixNano: end.UnixNano(),
		Outcome:         sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED,
		FinalProvenance: sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END,
		Final:           final, CpuUsec: proto.Uint64(cpuUsec), MemoryPeakBytes: proto.Uint64(s.GetMemoryPeakBytes()),
	}
}

// TestEndedActivationsCharged: the head of an activation begun after the
// agent started, the body, the tail from its record (once, however often the
// record is served), and a whole activation the agent never sampled, add up
// to the activations' own CPU; each ended activation is in the
// distributions and the activation log once.
func TestEndedActivationsCharged(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	var log bytes.Buffer
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, ActivationLog: &log}, discard())
	if err != nil {
		t.Fatal(err)
	}
	w1 := sample("w1", 2_000_000, 100<<20) // 2 s at the first sweep, 30 s into its epoch
	w1.EpochUnixNano = t0.Add(10 * time.Second).UnixNano()
	w1.ObservedAtUnixNano = t0.Add(40 * time.Second).UnixNano()
	m.Apply([]sweep.DaemonResult{okResult("1", w1)}, t0.Add(40*time.Second), 0)
	w1b := proto.Clone(w1).(*sandboxstatsv1.WorkloadStatsSample)
	w1b.CpuUsageUsec = proto.Uint64(5_000_000)
	w1b.ObservedAtUnixNano = t0.Add(100 * time.Second).UnixNano()
	m.Apply([]sweep.DaemonResult{okResult("1", w1b)}, t0.Add(100*time.Second), 0)

	// w1 ends at 6.5 s; w2 started and ended between two sweeps (1.25 s).
	w2 := sample("w2", 0, 10<<20)
	w2.EpochUnixNano = t0.Add(110 * time.Second).UnixNano()
	rec1, rec2 := endedOf(w1, t0.Add(120*time.Second), 6_500_000), endedOf(w2, t0.Add(125*time.Second), 1_250_000)
	rec2.Outcome = sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_OOM_KILLED
	idle := sweep.DaemonResult{Socket: "1", Status: sweep.StatusNoSample, Ended: []*sandboxstatsv1.EndedActivation{rec1, rec2}}
	for i := range 3 { // served three sweeps in a row: charged once
		m.Apply([]sweep.DaemonResult{idle}, t0.Add(time.Duration(160+60*i)*time.Second), 0)
	}
	got := gather(t, reg)
	if diff := cmp.Diff(map[string]float64{lCgroup: 7.75}, pick(got, metricCPUSeconds), approx()); diff != "" {
		t.Errorf("cpu (-want +got):\n%s", diff)
	}
	want := map[string]float64{
		metricActivationCPU + "_sum" + lCgroup:   7.75,
		metricActivationCPU + "_count" + lCgroup: 2,
		metricActivationsEnded + "{outcome=checkpointed,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}":   1,
		metricActivationsEnded + "{outcome=oom-killed,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}":     1,
		metricActivationFinals + "{provenance=read-at-end,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}": 2,
		metricActivationDuration + "_sum" + lCgroup: 110 + 15,
	}
	for k, v := range want {
		if d := got[k] - v; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("activation log has %d lines, want 2:\n%s", len(lines), log.String())
	}
	var r ActivationRecord
	if err := json.Unmarshal([]byte(lines[1]), &r); err != nil {
		t.Fatal(err)
	}
	if r.ActorUID != "w2" || r.Outcome != "oom-killed" || r.Charge != "whole" || r.ChargedSeconds != 1.25 || *r.CPUSeconds != 1.25 || r.FinalProvenance != "read-at-end" {
		t.Errorf("log record %+v", r)
	}
}

// TestSeveralActorsOfOneDaemonCharged: one statsd serving several actors
// answers their samples and records in one result; each actor is charged
// its own head, body and tail, and a whole activation ended between two
// sweeps, however the records of the others interleave.
func TestSeveralActorsOfOneDaemonCharged(t *testing.T) {
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: 5 * time.Minute, Started: t0}, discard())
	if err != nil {
		t.Fatal(err)
	}
	at := func(s *sandboxstatsv1.WorkloadStatsSample, epoch, observed time.Duration) *sandboxstatsv1.WorkloadStatsSample {
		s.EpochUnixNano, s.ObservedAtUnixNano = t0.Add(epoch).UnixNano(), t0.Add(observed).UnixNano()
		return s
	}
	// Both begin after the agent started: their heads are charged.
	m.Apply([]sweep.DaemonResult{okResult("1", at(sample("a1", 2_000_000, 64<<20), 10*time.Second, 40*time.Second),
		at(sample("a2", 1_000_000, 32<<20), 20*time.Second, 40*time.Second))}, t0.Add(40*time.Second), 0)
	a1 := at(sample("a1", 5_000_000, 64<<20), 10*time.Second, 100*time.Second)
	m.Apply([]sweep.DaemonResult{okResult("1", a1, at(sample("a2", 3_000_000, 32<<20), 20*time.Second, 100*time.Second))}, t0.Add(100*time.Second), 0)
	// a1 ends at 6.5 s; a3 runs 1.25 s between two sweeps; a2 goes on.
	a3 := at(sample("a3", 0, 8<<20), 110*time.Second, 110*time.Second)
	r := okResult("1", at(sample("a2", 4_000_000, 32<<20), 20*time.Second, 160*time.Second))
	r.Ended = []*sandboxstatsv1.EndedActivation{endedOf(a1, t0.Add(120*time.Second), 6_500_000), endedOf(a3, t0.Add(125*time.Second), 1_250_000)}
	for i := range 2 { // served twice: charged once
		m.Apply([]sweep.DaemonResult{r}, t0.Add(time.Duration(160+60*i)*time.Second), 0)
	}
	got := pick(gather(t, reg), metricCPUSeconds)
	want := map[string]float64{}
	for actor, cpu := range map[string]float64{"a1": 6.5, "a2": 4, "a3": 1.25} {
		want[fmt.Sprintf("{actor_name=%s-name,actor_namespace=team-a,actor_uid=%s,sandbox_class=gvisor,source=cgroup,template_name=python,template_namespace=templates}", actor, actor)] = cpu
	}
	if diff := cmp.Diff(want, got, approx()); diff != "" {
		t.Errorf("cpu per actor (-want +got):\n%s", diff)
	}
}

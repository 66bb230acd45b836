package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationNRIStop: a runc pod stopped with crictl stopp ends on its
// statsd with one record whose final was read at the end from the pod's
// cgroup, which outlives the sandbox (NRI tells a plugin of the stop only
// once the sandbox is gone: docs/nri.md): its CPU and peak are the pod
// cgroup's own kept counters, to the usec and the byte, and its outcome is
// checkpointed (the bridge says the runtime stopped it).
func TestIntegrationNRIStop(t *testing.T) {
	r := startNRIRig(t)
	r.bridge.start(t)
	r.bridge.waitHealthy(t, 10*time.Second)
	web := r.runPod(t, "stop-me", "", -1, "tmpl-web")
	r.waitBound(t, 2*time.Second, web)
	if !testenv.CgroupV2() {
		// CPU of its own in the pod beside the pause process, ended before
		// the stop as a container would be.
		leaf := web.cgroup + "/app"
		for _, d := range cgroupDirs(leaf) {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		w := testenv.StartChild(t, "TestWorkloadChild")
		moveTo(t, leaf, w.Cmd.Process.Pid)
		w.Do(t, "alloc 24")
		w.Do(t, "burn 200")
		w.Kill()
	}

	// The orderly stop.
	stopped := time.Now()
	r.c.StopPod(t, web.id)
	returned := time.Now()
	rec := r.waitEnded(t, 10*time.Second, web.uid)[web.uid]
	k := readKernel(t, web.cgroup) // no process left: its counters no longer move
	end := time.Unix(0, rec.GetEndUnixNano())
	t.Logf("runc pod %s stopped (crictl stopp took %v); checkpointed %v after crictl stopp returned: outcome %s, final %s, CPU %d us (kernel %d), peak %d B (kernel %d), final's processes %s",
		web.name, returned.Sub(stopped).Round(time.Millisecond), end.Sub(returned).Round(time.Millisecond),
		api.OutcomeName(rec.GetOutcome()), api.ProvenanceName(rec.GetFinalProvenance()), rec.GetCpuUsec(), k.cpuUsec,
		rec.GetMemoryPeakBytes(), k.peak, deref32(rec.GetFinal().SandboxProcesses))
	if want := orderlyStopOutcome(); rec.GetOutcome() != want {
		t.Errorf("the stopped runc pod's outcome is %s, want %s (orderlyStopOutcome)", api.OutcomeName(rec.GetOutcome()), api.OutcomeName(want))
	}
	if rec.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END {
		t.Errorf("the stopped runc pod's final is %s (%s), want read-at-end", api.ProvenanceName(rec.GetFinalProvenance()), rec.GetFinalReason())
	}
	if rec.CpuUsec == nil || rec.GetCpuUsec() != k.cpuUsec || rec.GetFinal().GetCpuUsageUsec() != k.cpuUsec {
		t.Errorf("the stopped runc pod's CPU %v (final %d us), want its pod cgroup's %d us", rec.CpuUsec, rec.GetFinal().GetCpuUsageUsec(), k.cpuUsec)
	}
	if rec.MemoryPeakBytes == nil || rec.GetMemoryPeakBytes() != k.peak || rec.GetMemoryPeakIsLowerBound() {
		t.Errorf("the stopped runc pod's peak %v (lower bound %v), want its pod cgroup's %d B", rec.MemoryPeakBytes, rec.GetMemoryPeakIsLowerBound(), k.peak)
	}
	if !testenv.CgroupV2() && k.peak < 24<<20 {
		t.Errorf("the pod cgroup's peak %d B is below its workload's 24 MiB", k.peak)
	}
	if rec.GetIdentity().GetActorName() != web.name || rec.GetIdentity().GetTemplateName() != web.template ||
		rec.GetEndUnixNano() < stopped.UnixNano() || !strings.Contains(rec.GetFinal().GetSourceDetail(), web.cgroup) {
		t.Errorf("the stopped runc pod's record: %v", rec)
	}
	r.c.RemovePod(t, web.id)

	time.Sleep(500 * time.Millisecond)
	if n := len(r.ended(t)[web.uid]); n != 1 {
		t.Errorf("pod %s has %d ended records, want 1", web.name, n)
	}
	if b := r.bindings(t); len(b) != 0 {
		t.Errorf("still bound after the pod ended: %v", b)
	}
}

// TestIntegrationNRIDeath: a runsc pod killed under the runtime (NRI says
// nothing: the kubelet, here the test, stops it later). statsd's drift
// check (every 500 ms here, no grace) sees the sandbox dead; the stop that
// follows, though the bridge says the runtime stopped it, records
// sandbox-dead: statsd saw the death first. The final is the last good
// poll.
func TestIntegrationNRIDeath(t *testing.T) {
	r := startNRIRigWith(t, []string{"--drift-interval", "500ms", "--drift-grace", "0s"})
	r.bridge.start(t)
	r.bridge.waitHealthy(t, 10*time.Second)
	gv := r.runPod(t, "die", "runsc", -1, "tmpl-gv")
	r.waitBound(t, 2*time.Second, gv)
	time.Sleep(time.Second) // a poll or two of the live sandbox: its last good one is the final

	r.c.KillRunscPod(t, gv.id)
	killed := time.Now()
	var seen string
	waitFor(t, 15*time.Second, func() bool {
		for _, st := range r.stats {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := st.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
			cancel()
			if err != nil {
				t.Fatalf("ListDriftFindings: %v", err)
			}
			for _, f := range resp.GetFindings() {
				switch f.GetKind() {
				case sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, sandboxstatsv1.DriftKind_DRIFT_KIND_SENTRY_GONE,
					sandboxstatsv1.DriftKind_DRIFT_KIND_CGROUP_GONE, sandboxstatsv1.DriftKind_DRIFT_KIND_OOM_KILLED:
					if f.GetActorUid() == gv.uid {
						seen = api.DriftKindName(f.GetKind()) + ": " + f.GetDetail()
					}
				}
			}
		}
		return seen != ""
	}, "statsd's drift check to see the runsc pod dead")
	t.Logf("statsd saw the runsc pod dead %v after the kill: %s", time.Since(killed).Round(time.Millisecond), seen)
	r.c.StopPod(t, gv.id)
	r.c.RemovePod(t, gv.id)
	grec := r.waitEnded(t, 10*time.Second, gv.uid)[gv.uid]
	t.Logf("runsc pod %s: outcome %s, final %s (age %v, %s), CPU %d us", gv.name, api.OutcomeName(grec.GetOutcome()),
		api.ProvenanceName(grec.GetFinalProvenance()), time.Duration(grec.GetFinalAgeNanos()).Round(time.Millisecond), grec.GetFinalReason(), grec.GetCpuUsec())
	if grec.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_SANDBOX_DEAD {
		t.Errorf("the killed runsc pod's outcome is %s, want sandbox-dead", api.OutcomeName(grec.GetOutcome()))
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(r.ended(t)[gv.uid]); n != 1 {
		t.Errorf("pod %s has %d ended records, want 1", gv.name, n)
	}
	if b := r.bindings(t); len(b) != 0 {
		t.Errorf("still bound after the pod ended: %v", b)
	}
}

package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func bindMicroVM(t *testing.T, dir string, ref *sandboxstatsv1.SandboxRef) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := sandboxstatsv1.NewWorkloadLifecycleServiceClient(dial(t, filepath.Join(dir, "lifecycle.sock"))).RunWorkload(ctx,
		&sandboxstatsv1.RunWorkloadRequest{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-vm"}, Sandbox: ref})
	if err != nil {
		t.Fatal(err)
	}
}

func listDrift(t *testing.T, dir string) *sandboxstatsv1.ListDriftFindingsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := sandboxstatsv1.NewWorkloadStatsServiceClient(dial(t, filepath.Join(dir, "statsd.sock"))).ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestDriftOffReadsNothing: with --drift-interval 0 no check runs, so a bound
// agent that nobody polls sees only the epoch's baseline read (one
// StatsContainer on one connection, taken right after the Run), then nothing.
func TestDriftOffReadsNothing(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	dir, _ := startStatsdIn(t, t.TempDir(), io.Discard, "--drift-interval", "0", "--drift-grace", "0s")
	bindMicroVM(t, dir, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: agent.Address(), ContainerIds: []string{"web"}})
	time.Sleep(500 * time.Millisecond)
	_, _, stats, versions := agent.Counts()
	if dials := agent.Dials(); dials != 1 || stats != 1 || versions != 1 {
		t.Fatalf("after the Run the agent saw %d dials, %d StatsContainer, %d Version calls; want the one baseline read", dials, stats, versions)
	}
	time.Sleep(time.Second)
	if _, _, stats2, versions2 := agent.Counts(); agent.Dials() != 1 || stats2 != stats || versions2 != versions {
		t.Fatalf("drift off, yet the agent saw more calls: %d dials, %d StatsContainer, %d Version", agent.Dials(), stats2, versions2)
	}
	if st := listDrift(t, dir).GetStatus(); st.GetEnabled() || st.GetLastCycleUnixNano() != 0 {
		t.Fatalf("status = %v, want off with no cycle", st)
	}
}

// TestDriftFindingSurvivesRestart: a finding open when statsd restarts is
// still listed afterwards and is not reported again.
func TestDriftFindingSurvivesRestart(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	dir := t.TempDir()
	var logs1 testenv.SyncBuffer
	_, stop := startStatsdIn(t, dir, &logs1, "--drift-interval", "100ms", "--drift-grace", "0s")
	pidFile := filepath.Join(t.TempDir(), "srv1", "qemu.pid") // never created: the VMM is gone
	bindMicroVM(t, dir, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
		AgentAddress: agent.Address(), ContainerIds: []string{"web"}, VmmPidFile: pidFile})

	var first *sandboxstatsv1.DriftFinding
	for deadline := time.Now().Add(10 * time.Second); first == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if f := listDrift(t, dir).GetFindings(); len(f) == 1 {
			first = f[0]
		}
	}
	if first == nil || first.GetKind() != sandboxstatsv1.DriftKind_DRIFT_KIND_VMM_GONE {
		t.Fatalf("finding = %v, want VMM_GONE", first)
	}
	if n := strings.Count(logs1.String(), "level=WARN msg=\"drift:"); n != 1 {
		t.Fatalf("%d drift WARN lines before the restart, want 1:\n%s", n, logs1.String())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	var logs2 testenv.SyncBuffer
	startStatsdIn(t, dir, &logs2, "--drift-interval", "100ms", "--drift-grace", "0s")
	resp := listDrift(t, dir)
	for deadline := time.Now().Add(10 * time.Second); resp.GetStatus().GetLastOutcome() != "checked" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp = listDrift(t, dir) // wait for a cycle after the restart
	}
	time.Sleep(300 * time.Millisecond) // a few more cycles: none may re-report
	resp = listDrift(t, dir)
	if len(resp.GetFindings()) != 1 || resp.GetFindings()[0].GetFirstSeenUnixNano() != first.GetFirstSeenUnixNano() {
		t.Fatalf("after restart findings = %v, want the same finding (first seen %d)", resp.GetFindings(), first.GetFirstSeenUnixNano())
	}
	if resp.GetStatus().GetLastOutcome() != "checked" {
		t.Fatalf("no cycle ran after the restart: %v", resp.GetStatus())
	}
	if strings.Contains(logs2.String(), "level=WARN msg=\"drift:") {
		t.Fatalf("re-reported after restart:\n%s", logs2.String())
	}
	// The sample carries the count.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := sandboxstatsv1.NewWorkloadStatsServiceClient(dial(t, filepath.Join(dir, "statsd.sock"))).StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm"})
	if err != nil || s.GetSample().GetOpenDriftFindings() != 1 {
		t.Fatalf("sample open_drift_findings = %d, %v; want 1", s.GetSample().GetOpenDriftFindings(), err)
	}
	t.Logf("observed: finding %s %s kept across the restart, %d WARN line(s) before, none after", first.GetKind(), first.GetSubject(), 1)
}

package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationQEMUThroughStatsd binds a real QEMU to a real statsd as a
// micro-VM whose guest agent cannot be reached (hvsock to a missing socket),
// and reads the host view through StatsHost (statsctl host): the host view
// must answer exactly when the guest does not.
func TestIntegrationQEMUThroughStatsd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds statsd and starts QEMU; not under -short")
	}
	accel := testenv.Accel() // tcg without /dev/kvm
	testenv.NeedQEMU(t)
	vm := testenv.StartQEMU(t, t.TempDir(), "srv1", accel)
	vm.WaitReady(5 * time.Second)
	bin := testenv.BuildBinaries(t)
	d := testenv.StartStatsd(t, bin, "--debugfs-root", "/sys/kernel/debug")
	ctl := func(args ...string) ([]byte, error) {
		return exec.Command(filepath.Join(bin, "statsctl"), args...).CombinedOutput()
	}
	const actor = "e2e-qemu-actor"
	if out, err := ctl("run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--class", "microvm",
		"--agent-address", "hvsock:///nonexistent:1024", "--container-id", "c",
		"--vmm-pid-file", vm.PIDFile, "--qmp-socket", vm.QMP); err != nil {
		t.Fatalf("run-workload: %v\n%s", err, out)
	}
	out, err := ctl("stats", "--socket", d.Stats, "--actor-uid", actor, "--include-host", "-o", "json")
	t.Logf("statsctl stats --include-host with the agent unreachable: err %v: %.300s", err, out)

	out, err = ctl("host", "--socket", d.Stats, "--actor-uid", actor, "-o", "json")
	if err != nil {
		t.Fatalf("statsctl host: %v\n%s", err, out)
	}
	var resp sandboxstatsv1.StatsHostResponse
	if err := protojson.Unmarshal(out, &resp); err != nil {
		t.Fatalf("statsctl host -o json: %v\n%s", err, out)
	}
	h := resp.GetHost()
	if resp.GetIdentity().GetActorUid() != actor || h.GetGuestName() != "srv1" {
		t.Errorf("actor %q guest %q, want %s and srv1", resp.GetIdentity().GetActorUid(), h.GetGuestName(), actor)
	}
	if h.GetVmmThreads().GetError() != "" || h.GetVmmThreads().GetVcpuTotals().GetThreads() != 2 {
		t.Errorf("threads: error %q, %d vCPU threads, want 2", h.GetVmmThreads().GetError(), h.GetVmmThreads().GetVcpuTotals().GetThreads())
	}
	if h.GetRunnerKernel().GetTotal() == nil {
		t.Errorf("runner kernel view missing: %q", h.GetRunnerKernel().GetError())
	}
	// The debugfs view as statsctl printed it: what this host allows, never zeros.
	dv := h.GetKvm().GetDebugfs()
	switch dv.GetState() {
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE, sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL:
		if len(dv.GetCounters()) == 0 {
			t.Error("debugfs available without counters")
		}
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE:
		if dv.GetReason() == "" {
			t.Error("debugfs unavailable without a reason")
		}
		for _, c := range dv.GetCounters() {
			if c.GetKind() == sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE {
				t.Errorf("unavailable debugfs carries counter %s", c.GetName())
			}
		}
	default:
		t.Errorf("debugfs state %v", dv.GetState())
	}
	q := h.GetKvm().GetQmp()
	if accel == "kvm" && q.GetState() != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE {
		t.Errorf("qmp %v %q", q.GetState(), q.GetReason())
	}
	if accel == "tcg" && !strings.Contains(q.GetReason(), "no kvm statistics") {
		t.Errorf("qmp under TCG %v %q", q.GetState(), q.GetReason())
	}
}

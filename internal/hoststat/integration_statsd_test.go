package hoststat_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// statsd is a real statsd built from ./cmd/statsd with the statsctl beside it.
type statsd struct {
	bin, dir, stats, lifecycle string
}

func startStatsd(t *testing.T) *statsd {
	t.Helper()
	d := &statsd{bin: t.TempDir(), dir: t.TempDir()}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(gobin, "build", "-o", d.bin+"/",
		"github.com/sandboxstats/sandboxstats/cmd/statsd", "github.com/sandboxstats/sandboxstats/cmd/statsctl").CombinedOutput(); err != nil {
		t.Fatalf("go build statsd statsctl: %v\n%s", err, out)
	}
	d.stats, d.lifecycle = filepath.Join(d.dir, "stats.sock"), filepath.Join(d.dir, "lifecycle.sock")
	cmd := exec.Command(filepath.Join(d.bin, "statsd"), "--listen", d.stats, "--lifecycle-listen", d.lifecycle,
		"--state-dir", filepath.Join(d.dir, "state"), "--cgroup-root", "/sys/fs/cgroup", "--proc-root", "/proc",
		"--debugfs-root", "/sys/kernel/debug", "--read-timeout", "2s")
	logf, err := os.Create(filepath.Join(d.dir, "statsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(d.dir, "statsd.log"))
			t.Logf("statsd.log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, e1 := os.Stat(d.stats)
		_, e2 := os.Stat(d.lifecycle)
		if e1 == nil && e2 == nil {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatal("statsd did not create its sockets within 10 s")
		}
	}
}

func (d *statsd) ctl(args ...string) ([]byte, error) {
	return exec.Command(filepath.Join(d.bin, "statsctl"), args...).CombinedOutput()
}

// TestIntegrationQEMUThroughStatsd binds a real QEMU to a real statsd as a
// micro-VM whose guest agent cannot be reached (hvsock to a missing socket),
// and reads the host view through StatsHost (statsctl host): the host view
// must answer exactly when the guest does not.
func TestIntegrationQEMUThroughStatsd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds statsd and starts QEMU; not under -short")
	}
	accel := "kvm"
	if _, err := os.Stat("/dev/kvm"); err != nil {
		accel = "tcg" // TestIntegrationQEMUKVM already fails under CI=true without /dev/kvm
	}
	vm := startQEMU(t, accel)
	d := startStatsd(t)
	const actor = "e2e-qemu-actor"
	if out, err := d.ctl("run-workload", "--lifecycle-socket", d.lifecycle, "--actor-uid", actor, "--class", "microvm",
		"--agent-address", "hvsock:///nonexistent:1024", "--container-id", "c",
		"--vmm-pid-file", vm.PIDFile, "--qmp-socket", vm.QMP); err != nil {
		t.Fatalf("run-workload: %v\n%s", err, out)
	}
	out, err := d.ctl("stats", "--socket", d.stats, "--actor-uid", actor, "--include-host", "-o", "json")
	t.Logf("statsctl stats --include-host with the agent unreachable: err %v: %.300s", err, out)

	out, err = d.ctl("host", "--socket", d.stats, "--actor-uid", actor, "-o", "json")
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
	checkDebugfs(t, h.GetKvm().GetDebugfs())
	q := h.GetKvm().GetQmp()
	if accel == "kvm" && q.GetState() != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE {
		t.Errorf("qmp %v %q", q.GetState(), q.GetReason())
	}
	if accel == "tcg" && !strings.Contains(q.GetReason(), "no kvm statistics") {
		t.Errorf("qmp under TCG %v %q", q.GetState(), q.GetReason())
	}
}

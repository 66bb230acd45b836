package hoststat_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// startQEMU starts a 2-vCPU QEMU with no guest (SeaBIOS only) named srv1
// (testenv.StartQEMU) and waits for its vCPU threads and QMP socket.
func startQEMU(t *testing.T, accel string) *testenv.QEMU {
	t.Helper()
	testenv.NeedQEMU(t)
	if accel == "kvm" {
		// /dev/kvm is the machine's, not something .ci/run can install, so
		// its absence skips even under CI=true; TestIntegrationQEMUTCG runs
		// the same checks on a real QEMU without it.
		if _, err := os.Stat("/dev/kvm"); err != nil {
			t.Skip("/dev/kvm is missing on this machine (hardware, not installable): the KVM variant cannot run; the TCG variant covers real QEMU")
		}
	}
	vm := testenv.StartQEMU(t, t.TempDir(), "srv1", accel)
	vm.WaitReady(5 * time.Second)
	return vm
}

type qemuRun struct {
	before, after *sandboxstatsv1.HostStats
	report        hoststat.WindowReport
}

func sampleQEMU(t *testing.T, vm *testenv.QEMU, window time.Duration) qemuRun {
	t.Helper()
	s, err := hoststat.Open(source.SandboxRef{Class: source.ClassMicroVM, VMMPIDFile: vm.PIDFile, QMPSocket: vm.QMP},
		hoststat.Config{ReadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	start := time.Now()
	before, err := s.SampleHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one host sample of a live QEMU took %v", time.Since(start))
	time.Sleep(window)
	after, err := s.SampleHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Duration(after.ObservedAtUnixNano - before.ObservedAtUnixNano)
	r := qemuRun{before: before, after: after, report: hoststat.Window(before, after, elapsed)}
	var b bytes.Buffer
	hoststat.WriteSampleTable(&b, after)
	b.WriteString("\n")
	hoststat.WriteWindowTable(&b, r.report)
	t.Logf("sample and window:\n%s", b.String())
	return r
}

// checkThreads: two vCPU threads named "CPU <n>/<accel>", classified vCPU,
// the guest is srv1, and the vCPUs' CPU time grows across the window.
func checkThreads(t *testing.T, r qemuRun, accel string) {
	t.Helper()
	a := r.after
	if a.GuestName != "srv1" {
		t.Errorf("guest %q from %q, want srv1", a.GuestName, a.GuestNameSource)
	}
	tv := a.VmmThreads
	if tv.Error != "" {
		t.Fatalf("threads view: %s", tv.Error)
	}
	var names []string
	for _, th := range tv.Threads {
		if th.Class == sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU {
			names = append(names, th.Name)
		}
	}
	want := []string{"CPU 0/" + strings.ToUpper(accel), "CPU 1/" + strings.ToUpper(accel)}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("vCPU threads %q, want %q", names, want)
	}
	if tv.OtherTotals.GetThreads() < 2 {
		t.Errorf("other threads %d, want the main loop and call_rcu at least", tv.OtherTotals.GetThreads())
	}
	b, at := r.before.VmmThreads.VcpuTotals, tv.VcpuTotals
	if at.RunNs <= b.RunNs && at.UtimeUsec+at.StimeUsec <= b.UtimeUsec+b.StimeUsec {
		t.Errorf("vCPU CPU time did not grow: run ns %d -> %d, utime+stime usec %d -> %d",
			b.RunNs, at.RunNs, b.UtimeUsec+b.StimeUsec, at.UtimeUsec+at.StimeUsec)
	}
	if a.RunnerKernel.Error != "" || a.RunnerKernel.Total.GetIdleUsec() == 0 {
		t.Errorf("runner kernel view: %q", a.RunnerKernel.Error)
	}
}

// checkDebugfs: the debugfs view says what this host allows, never zeros.
func checkDebugfs(t *testing.T, v *sandboxstatsv1.KvmSourceView) {
	t.Helper()
	t.Logf("debugfs view: %v %q %q", v.State, v.Origin, v.Reason)
	switch v.State {
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE, sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL:
		if len(v.Counters) == 0 {
			t.Error("debugfs available without counters")
		}
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE:
		if v.Reason == "" {
			t.Error("debugfs unavailable without a reason")
		}
		for _, c := range v.Counters {
			if c.Kind == sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE {
				t.Errorf("unavailable debugfs carries counter %s", c.Name)
			}
		}
	default:
		t.Errorf("debugfs state %v", v.State)
	}
}

// TestIntegrationQEMUKVM is the real end-to-end test on a KVM host.
func TestIntegrationQEMUKVM(t *testing.T) {
	vm := startQEMU(t, "kvm")
	r := sampleQEMU(t, vm, 1500*time.Millisecond)
	checkThreads(t, r, "kvm")
	checkDebugfs(t, r.after.Kvm.Debugfs)
	if lockdown, _ := os.ReadFile("/sys/kernel/security/lockdown"); bytes.Contains(lockdown, []byte("[integrity]")) || bytes.Contains(lockdown, []byte("[confidentiality]")) {
		if r.after.Kvm.Debugfs.State != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE || !strings.Contains(r.after.Kvm.Debugfs.Reason, "operation not permitted") {
			t.Errorf("under lockdown debugfs must be unavailable with EPERM, got %v %q", r.after.Kvm.Debugfs.State, r.after.Kvm.Debugfs.Reason)
		}
	}
	q := r.after.Kvm.Qmp
	if q.State != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE {
		t.Fatalf("qmp %v %q", q.State, q.Reason)
	}
	var exits uint64
	for _, row := range r.report.Rows {
		if row.Layer == hoststat.LayerKVMQMP && strings.HasSuffix(row.Name, " exits") {
			exits += row.Delta
		}
	}
	if exits == 0 {
		t.Errorf("QMP exits did not grow across the window; findings %q", r.report.Findings)
	}
}

// TestIntegrationQEMUTCG runs the same checks where /dev/kvm is missing:
// QEMU's TCG vCPU threads ("CPU <n>/TCG") are classified, and both KVM
// sources say why they have nothing.
func TestIntegrationQEMUTCG(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	vm := startQEMU(t, "tcg")
	r := sampleQEMU(t, vm, time.Second)
	checkThreads(t, r, "tcg")
	checkDebugfs(t, r.after.Kvm.Debugfs)
	if r.after.Kvm.Debugfs.State != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE {
		t.Errorf("TCG QEMU has no KVM VM, debugfs %v", r.after.Kvm.Debugfs.State)
	}
	if q := r.after.Kvm.Qmp; q.State != sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE || !strings.Contains(q.Reason, "no kvm statistics") {
		t.Errorf("qmp under TCG: %v %q", q.State, q.Reason)
	}
}

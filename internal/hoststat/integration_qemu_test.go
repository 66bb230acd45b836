package hoststat_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
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
	before, after *source.HostStats
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
	b, _ := json.MarshalIndent(after, "", "  ")
	t.Logf("second sample, %v after the first:\n%s", time.Duration(after.ObservedAtUnixNano-before.ObservedAtUnixNano), b)
	return qemuRun{before: before, after: after}
}

// checkThreads: two vCPU threads named "CPU <n>/<accel>", classified vCPU,
// the guest is srv1, and the vCPUs' CPU time grows across the window.
func checkThreads(t *testing.T, r qemuRun, accel string) {
	t.Helper()
	a := r.after
	if a.GuestName != "srv1" {
		t.Errorf("guest %q from %q, want srv1", a.GuestName, a.GuestNameSource)
	}
	tv := a.VMMThreads
	if tv.Error != "" {
		t.Fatalf("threads view: %s", tv.Error)
	}
	var names []string
	for _, th := range tv.Threads {
		if th.Class == source.VMMThreadClassVCPU {
			names = append(names, th.Name)
		}
	}
	want := []string{"CPU 0/" + strings.ToUpper(accel), "CPU 1/" + strings.ToUpper(accel)}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("vCPU threads %q, want %q", names, want)
	}
	if tv.OtherTotals.Threads < 2 {
		t.Errorf("other threads %d, want the main loop and call_rcu at least", tv.OtherTotals.Threads)
	}
	b, at := r.before.VMMThreads.VCPUTotals, tv.VCPUTotals
	if at.RunNs <= b.RunNs && at.UtimeUsec+at.StimeUsec <= b.UtimeUsec+b.StimeUsec {
		t.Errorf("vCPU CPU time did not grow: run ns %d -> %d, utime+stime usec %d -> %d",
			b.RunNs, at.RunNs, b.UtimeUsec+b.StimeUsec, at.UtimeUsec+at.StimeUsec)
	}
	// Per thread, as a window differences them: some vCPU thread present in
	// both samples (same tid and start time) ran more.
	type key struct {
		tid   int32
		start uint64
	}
	prev := map[key]source.VMMThread{}
	for _, th := range r.before.VMMThreads.Threads {
		prev[key{th.TID, th.StartTimeTicks}] = th
	}
	grew := false
	for _, th := range tv.Threads {
		p, ok := prev[key{th.TID, th.StartTimeTicks}]
		if ok && th.Class == source.VMMThreadClassVCPU && p.RunNs != nil && th.RunNs != nil && *th.RunNs > *p.RunNs {
			grew = true
		}
	}
	if !grew {
		t.Error("no vCPU thread present in both samples had its run time grow")
	}
	if a.RunnerKernel.Error != "" || a.RunnerKernel.Total == nil || a.RunnerKernel.Total.IdleUsec == 0 {
		t.Errorf("runner kernel view: %q", a.RunnerKernel.Error)
	}
}

// checkDebugfs: the debugfs view says what this host allows, never zeros.
func checkDebugfs(t *testing.T, v *source.KVMSourceView) {
	t.Helper()
	t.Logf("debugfs view: %v %q %q", v.State, v.Origin, v.Reason)
	switch v.State {
	case source.KVMSourceStateAvailable, source.KVMSourceStatePartial:
		if len(v.Counters) == 0 {
			t.Error("debugfs available without counters")
		}
	case source.KVMSourceStateUnavailable:
		if v.Reason == "" {
			t.Error("debugfs unavailable without a reason")
		}
		for _, c := range v.Counters {
			if c.Kind == source.KVMCounterKindCumulative {
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
	checkDebugfs(t, r.after.KVM.Debugfs)
	if lockdown, _ := os.ReadFile("/sys/kernel/security/lockdown"); bytes.Contains(lockdown, []byte("[integrity]")) || bytes.Contains(lockdown, []byte("[confidentiality]")) {
		if r.after.KVM.Debugfs.State != source.KVMSourceStateUnavailable || !strings.Contains(r.after.KVM.Debugfs.Reason, "operation not permitted") {
			t.Errorf("under lockdown debugfs must be unavailable with EPERM, got %v %q", r.after.KVM.Debugfs.State, r.after.KVM.Debugfs.Reason)
		}
	}
	q := r.after.KVM.QMP
	if q.State != source.KVMSourceStateAvailable {
		t.Fatalf("qmp %v %q", q.State, q.Reason)
	}
	if bq := r.before.KVM.QMP; bq.State != source.KVMSourceStateAvailable || bq.Origin != q.Origin {
		t.Fatalf("qmp before the window %v %q origin %q", bq.State, bq.Reason, bq.Origin)
	}
	// Summed over the vCPUs present in both samples, cumulative exits grew.
	exitsBefore := map[string]uint64{}
	for _, c := range r.before.KVM.QMP.Counters {
		if c.Name == "exits" && c.Kind == source.KVMCounterKindCumulative {
			exitsBefore[c.Scope] = c.Value
		}
	}
	var grew uint64
	for _, c := range q.Counters {
		if b, ok := exitsBefore[c.Scope]; ok && c.Name == "exits" && c.Kind == source.KVMCounterKindCumulative && c.Value > b {
			grew += c.Value - b
		}
	}
	if len(exitsBefore) == 0 || grew == 0 {
		t.Errorf("QMP exits did not grow across the window (%d vCPU exits counters before)", len(exitsBefore))
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
	checkDebugfs(t, r.after.KVM.Debugfs)
	if r.after.KVM.Debugfs.State != source.KVMSourceStateUnavailable {
		t.Errorf("TCG QEMU has no KVM VM, debugfs %v", r.after.KVM.Debugfs.State)
	}
	if q := r.after.KVM.QMP; q.State != source.KVMSourceStateUnavailable || !strings.Contains(q.Reason, "no kvm statistics") {
		t.Errorf("qmp under TCG: %v %q", q.State, q.Reason)
	}
}

package hoststat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// writeThread writes task/<tid>/{stat,schedstat,comm} of process pid, and
// for the main thread (tid = pid) the process's own stat, as /proc has.
func writeThread(t *testing.T, root string, pid, tid int32, comm string) {
	t.Helper()
	dir := filepath.Join(strconv.Itoa(int(pid)), "task", strconv.Itoa(int(tid)))
	testenv.WriteProcFile(t, root, filepath.Join(dir, "stat"), testenv.ProcStatLine(tid, 1, comm, 85000))
	if tid == pid {
		testenv.WriteProcFile(t, root, filepath.Join(strconv.Itoa(int(pid)), "stat"), testenv.ProcStatLine(tid, 1, comm, 85000))
	}
	testenv.WriteProcFile(t, root, filepath.Join(dir, "schedstat"), "1000 20 3\n")
	testenv.WriteProcFile(t, root, filepath.Join(dir, "comm"), comm+"\n")
}

// hungFile puts a FIFO with no writer at rel: opening it never returns until
// the test ends.
func hungFile(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // release the hung open so its goroutine ends
		if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

func tempSampler(t *testing.T, root string, bound time.Duration) *sampler {
	t.Helper()
	s, err := newSampler(sourceRefNone, Config{ProcRoot: root, DebugfsRoot: t.TempDir(), ReadTimeout: bound, DisableDebugfsMount: true, Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestThreadsViewOneBound: five sandbox processes whose thread files hang
// cost the thread view one read timeout, not five.
func TestThreadsViewOneBound(t *testing.T) {
	root := t.TempDir()
	writeThread(t, root, 100, 100, "runsc-sandbox")
	procs := []int32{100}
	for pid := int32(101); pid <= 105; pid++ {
		hungFile(t, root, fmt.Sprintf("%d/task/%d/stat", pid, pid))
		procs = append(procs, pid)
	}
	const bound = 300 * time.Millisecond
	s := tempSampler(t, root, bound)
	start := time.Now()
	v, _, _, _ := s.threadsView(context.Background(), procs, "test", nil)
	took := time.Since(start)
	if took > 3*bound {
		t.Errorf("thread view took %v for 5 hung processes with a %v bound; want about one bound", took, bound)
	}
	if len(v.PIDs) != 1 || v.PIDs[0] != 100 || len(v.Threads) != 1 {
		t.Errorf("pids %v, %d threads; want the sentry's one thread", v.PIDs, len(v.Threads))
	}
	if len(v.ThreadErrors) == 0 {
		t.Errorf("no thread error for the hung processes")
	}
	t.Logf("took %v; errors %q", took, v.ThreadErrors)
}

// TestThreadsViewCmdlineOnlyOfVMM: only the first process's (the VMM's or
// sentry's) cmdline is read; a hung cmdline of another process does not cost
// that process its threads.
func TestThreadsViewCmdlineOnlyOfVMM(t *testing.T) {
	root := t.TempDir()
	writeThread(t, root, 100, 100, "qemu-system-x86")
	testenv.WriteProcFile(t, root, "100/cmdline", "qemu-system-x86_64\x00-name\x00guest=srv7\x00")
	writeThread(t, root, 200, 200, "gofer")
	hungFile(t, root, "200/cmdline")
	s := tempSampler(t, root, 300*time.Millisecond)
	v, name, nameSrc, _ := s.threadsView(context.Background(), []int32{100, 200}, "test", nil)
	if len(v.PIDs) != 2 || len(v.Threads) != 2 || len(v.ThreadErrors) != 0 {
		t.Errorf("pids %v, %d threads, errors %q; want both processes' threads", v.PIDs, len(v.Threads), v.ThreadErrors)
	}
	if name != "srv7" || nameSrc != "qemu-cmdline" {
		t.Errorf("guest name %q (%s), want srv7 from the VMM's cmdline", name, nameSrc)
	}
}

// TestThreadTotalsSkipUnknownSchedstat: run sums leave out threads without
// schedstat and say how many; a class where none has it is flagged unknown,
// not reported as a measured 0.
func TestThreadTotalsSkipUnknownSchedstat(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	vcpu, other := source.VMMThreadClassVCPU, source.VMMThreadClassOther
	ths := []source.VMMThread{
		{TID: 1, Class: vcpu, UtimeUsec: 10},
		{TID: 2, Class: vcpu, UtimeUsec: 20},
		{TID: 3, Class: other, UtimeUsec: 5, RunNs: u(100), RunDelayNs: u(7)},
		{TID: 4, Class: other, UtimeUsec: 5},
	}
	v, o, notes := threadTotals(ths)
	if v.Threads != 2 || v.UtimeUsec != 30 || v.RunNs != 0 || o.Threads != 2 || o.RunNs != 100 || o.RunDelayNs != 7 {
		t.Errorf("totals vcpu %v other %v", v, o)
	}
	want := []string{
		"vcpu totals: run_ns and run_delay_ns unknown: 2 of 2 threads without schedstat (the 0 is not a measurement)",
		"other totals: run_ns and run_delay_ns sum 1 threads only: 1 of 2 threads without schedstat",
	}
	if diff := cmp.Diff(want, notes); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
}

// TestThreadsFixtureNames: names with spaces, slashes and parentheses
// ("CPU 0/KVM", "a) (b") are read right through procfs (stat is split at the
// last ')'), with stat's ticks in usec and schedstat absent, not 0, where the
// file is missing.
func TestThreadsFixtureNames(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{VMMPID: 4242}, "debugfs-5.4")
	pt, err := readProcThreads(s.cfg.ProcRoot, 4242, true)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]source.VMMThread{}
	for _, th := range pt.threads {
		byName[th.Name] = th
	}
	vcpu, ok := byName["CPU 0/KVM"]
	if !ok || vcpu.TID != 4252 || vcpu.Class != source.VMMThreadClassVCPU || vcpu.VCPUIndex == nil || *vcpu.VCPUIndex != 0 {
		t.Errorf("CPU 0/KVM: %+v (present %v)", vcpu, ok)
	}
	if vcpu.StartTimeTicks != 85002 || vcpu.UtimeUsec != 150*usecPerTick || vcpu.StimeUsec != 328*usecPerTick || vcpu.GuestTimeUsec != 140*usecPerTick {
		t.Errorf("CPU 0/KVM ticks: start %d utime %d stime %d guest %d", vcpu.StartTimeTicks, vcpu.UtimeUsec, vcpu.StimeUsec, vcpu.GuestTimeUsec)
	}
	if vcpu.RunNs == nil || *vcpu.RunNs != 3290841689 || vcpu.RunDelayNs == nil || vcpu.RunCount == nil {
		t.Errorf("CPU 0/KVM schedstat: run %v delay %v count %v", vcpu.RunNs, vcpu.RunDelayNs, vcpu.RunCount)
	}
	parens, ok := byName["a) (b"]
	if !ok || parens.TID != 4254 || parens.StartTimeTicks != 85003 || parens.Class != source.VMMThreadClassOther {
		t.Errorf("a) (b: %+v (present %v)", parens, ok)
	}
	if parens.RunNs != nil || parens.RunDelayNs != nil || parens.RunCount != nil {
		t.Errorf("a) (b has no schedstat file, got run %v", parens.RunNs)
	}
	if want := []string{"qemu-system-x86_64"}; len(pt.cmdline) == 0 || pt.cmdline[0] != want[0] {
		t.Errorf("cmdline %q, want it to start with %q", pt.cmdline, want)
	}
}

// TestSentryRefListsSandboxProcesses: a sentry_pid ref gets its processes
// from Config.SandboxProcesses (gVisor's discovery), called with the proc
// root and the sentry, under the read bound; without it the view says why.
func TestSentryRefListsSandboxProcesses(t *testing.T) {
	root := t.TempDir()
	writeThread(t, root, 300, 300, "runsc-sandbox")
	writeThread(t, root, 301, 301, "exe")
	ref := source.SandboxRef{Class: source.ClassGVisor, SentryPID: 300}
	var gotRoot string
	var gotSentry int32
	s, err := newSampler(ref, Config{ProcRoot: root, DebugfsRoot: t.TempDir(), DisableDebugfsMount: true,
		SandboxProcesses: func(procRoot string, sentry int32) ([]int32, error) {
			gotRoot, gotSentry = procRoot, sentry
			return []int32{300, 301}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if gotRoot != root || gotSentry != 300 {
		t.Errorf("lister called with %q, %d; want %q, 300", gotRoot, gotSentry, root)
	}
	if v := hs.VMMThreads; v.Error != "" || v.ProcessSource != "sentry_pid 300" || len(v.PIDs) != 2 || len(v.Threads) != 2 {
		t.Errorf("threads view: error %q source %q pids %v, %d threads", v.Error, v.ProcessSource, v.PIDs, len(v.Threads))
	}
	if hs.KVM.Debugfs.State != source.KVMSourceStateNotConfigured {
		t.Errorf("debugfs %v for a gVisor sandbox, want not configured", hs.KVM.Debugfs.State)
	}

	t.Run("hung lister costs one bound", func(t *testing.T) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		const bound = 200 * time.Millisecond
		s, err := newSampler(ref, Config{ProcRoot: root, DebugfsRoot: t.TempDir(), DisableDebugfsMount: true, ReadTimeout: bound,
			SandboxProcesses: func(string, int32) ([]int32, error) { <-release; return nil, nil }})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		hs, _ := s.SampleHost(context.Background())
		if took := time.Since(start); took > 3*bound {
			t.Errorf("sample took %v with a hung lister and a %v bound", took, bound)
		}
		if !strings.Contains(hs.VMMThreads.Error, "timed out") {
			t.Errorf("threads error %q, want a timeout", hs.VMMThreads.Error)
		}
	})
	t.Run("no lister", func(t *testing.T) {
		s := tempSampler(t, root, time.Second)
		s.ref = ref
		hs, _ := s.SampleHost(context.Background())
		if !strings.Contains(hs.VMMThreads.Error, "no gVisor process discovery configured") {
			t.Errorf("threads error %q", hs.VMMThreads.Error)
		}
	})
}

package hoststat

import (
	"bytes"
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

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// writeProcFile writes one file of a temporary /proc tree.
func writeProcFile(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// taskStatLine is a stat line of thread tid (process pid's parent ppid).
func taskStatLine(tid, ppid int32, comm string, start uint64) string {
	return fmt.Sprintf("%d (%s) S %d 1 1 0 -1 4194368 1200 0 3 0 12 30 0 0 20 0 6 0 %d 1234567890 6500 18446744073709551615 1 1 0 0 0 0 0 4096 17664 0 0 0 -1 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		tid, comm, ppid, start)
}

// writeThread writes task/<tid>/{stat,schedstat,comm} of process pid.
func writeThread(t *testing.T, root string, pid, tid int32, comm string) {
	t.Helper()
	dir := filepath.Join(strconv.Itoa(int(pid)), "task", strconv.Itoa(int(tid)))
	writeProcFile(t, root, filepath.Join(dir, "stat"), taskStatLine(tid, 1, comm, 85000))
	writeProcFile(t, root, filepath.Join(dir, "schedstat"), "1000 20 3\n")
	writeProcFile(t, root, filepath.Join(dir, "comm"), comm+"\n")
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

func tempSampler(t *testing.T, root string, bound time.Duration) *Sampler {
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
	v, _, _ := s.threadsView(context.Background(), procs, "test", nil)
	took := time.Since(start)
	if took > 3*bound {
		t.Errorf("thread view took %v for 5 hung processes with a %v bound; want about one bound", took, bound)
	}
	if len(v.Pids) != 1 || v.Pids[0] != 100 || len(v.Threads) != 1 {
		t.Errorf("pids %v, %d threads; want the sentry's one thread", v.Pids, len(v.Threads))
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
	writeProcFile(t, root, "100/cmdline", "qemu-system-x86_64\x00-name\x00guest=srv7\x00")
	writeThread(t, root, 200, 200, "gofer")
	hungFile(t, root, "200/cmdline")
	s := tempSampler(t, root, 300*time.Millisecond)
	v, name, nameSrc := s.threadsView(context.Background(), []int32{100, 200}, "test", nil)
	if len(v.Pids) != 2 || len(v.Threads) != 2 || len(v.ThreadErrors) != 0 {
		t.Errorf("pids %v, %d threads, errors %q; want both processes' threads", v.Pids, len(v.Threads), v.ThreadErrors)
	}
	if name != "srv7" || nameSrc != "qemu-cmdline" {
		t.Errorf("guest name %q (%s), want srv7 from the VMM's cmdline", name, nameSrc)
	}
}

// TestThreadTotalsSkipUnknownSchedstat: run sums leave out threads without
// schedstat and say how many; a class where none has it is flagged unknown
// (and rendered "-"), not reported as a measured 0.
func TestThreadTotalsSkipUnknownSchedstat(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	vcpu, other := sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU, sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_OTHER
	ths := []*sandboxstatsv1.VmmThread{
		{Tid: 1, Class: vcpu, UtimeUsec: 10},
		{Tid: 2, Class: vcpu, UtimeUsec: 20},
		{Tid: 3, Class: other, UtimeUsec: 5, RunNs: u(100), RunDelayNs: u(7)},
		{Tid: 4, Class: other, UtimeUsec: 5},
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
	var buf bytes.Buffer
	tv := &sandboxstatsv1.VmmThreadsView{Threads: ths, VcpuTotals: v, OtherTotals: o, ThreadErrors: notes}
	if err := WriteSampleTable(&buf, &sandboxstatsv1.HostStats{VmmThreads: tv}); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] == "vcpu" && (f[5] != "-" || f[6] != "-") {
			t.Errorf("vcpu totals row %q: want - for the unknown run sums", line)
		}
	}
}

// TestSandboxProcessesNeedDescent: a gVisor sandbox's processes are the
// sentry's descendants (in its cgroup when that is not the root). With runsc
// --ignore-cgroups the sentry shares its parent's cgroup (a session scope),
// so an unrelated process there must not be counted.
func TestSandboxProcessesNeedDescent(t *testing.T) {
	const scope = "0::/user.slice/user-0.slice/session-1.scope\n"
	for _, tc := range []struct {
		name     string
		sentryCG string
		want     []int32
	}{
		{"sentry in a shared session scope", scope, []int32{300, 301, 302, 320}},
		{"sentry in the root cgroup", "0::/\n", []int32{300, 301, 302, 303}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			proc := func(pid, ppid int32, cg string) {
				writeProcFile(t, root, fmt.Sprintf("%d/stat", pid), taskStatLine(pid, ppid, "p", 1000))
				writeProcFile(t, root, fmt.Sprintf("%d/cgroup", pid), cg)
			}
			proc(300, 1, tc.sentryCG) // the sentry
			proc(301, 300, tc.sentryCG)
			proc(302, 301, tc.sentryCG)       // a grandchild
			proc(303, 300, "0::/elsewhere\n") // a child in another cgroup
			proc(310, 1, tc.sentryCG)         // unrelated, same cgroup
			proc(311, 310, tc.sentryCG)       // its child
			proc(320, 1, tc.sentryCG)         // the gofer: runsc-gofer with the sentry's --root
			proc(321, 1, tc.sentryCG)         // another sandbox's gofer (other --root)
			writeProcFile(t, root, "300/cmdline", "runsc-sandbox\x00--root=/run/runsc\x00boot\x00")
			writeProcFile(t, root, "320/cmdline", "runsc-gofer\x00--root=/run/runsc\x00gofer\x00")
			writeProcFile(t, root, "321/cmdline", "runsc-gofer\x00--root=/run/other\x00gofer\x00")
			writeProcFile(t, root, "stat", "cpu 0") // not a pid directory
			got, err := scanSandboxProcesses(root, 300)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sandbox processes (-want +got):\n%s", diff)
			}
		})
	}
}

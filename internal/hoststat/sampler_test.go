package hoststat

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

var sourceRefNone = source.SandboxRef{}

var fixedNow = func() time.Time { return time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC) }

// newFixtureSampler samples the fixture /proc tree and the named debugfs
// fixture, with a fixed clock.
func newFixtureSampler(t testing.TB, ref source.SandboxRef, debugfs string) *sampler {
	t.Helper()
	s, err := newSampler(ref, Config{
		ProcRoot:            filepath.Join("testdata", "proc"),
		DebugfsRoot:         filepath.Join("testdata", debugfs),
		ReadTimeout:         time.Second,
		DisableDebugfsMount: true,
		Now:                 fixedNow,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	testenv.Golden(t, name, got)
}

// sampleJSON is a host sample as its golden file holds it.
func sampleJSON(t *testing.T, hs *source.HostStats) []byte {
	t.Helper()
	b, err := json.MarshalIndent(hs, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestSampleQEMUFixture reads a QEMU VMM (pid file srv1/qemu.pid) against a
// 5.4-era debugfs holding two VMs and the top-level sums.
func TestSampleQEMUFixture(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{Class: source.ClassMicroVM, VMMPIDFile: filepath.Join("testdata", "srv1", "qemu.pid")}, "debugfs-5.4")
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if hs.GuestName != "srv1" || hs.GuestNameSource != "pid-file-dir" {
		t.Errorf("guest = %q from %q, want srv1 from pid-file-dir", hs.GuestName, hs.GuestNameSource)
	}
	// /proc/stat "cpu  1234567 ..." ticks -> usec.
	if got := hs.RunnerKernel.Total.UserUsec; got != 1234567*10000 {
		t.Errorf("user_usec = %d, want %d", got, 1234567*10000)
	}
	tv := hs.VMMThreads
	if tv.Error != "" || len(tv.Threads) != 6 {
		t.Fatalf("threads: error %q, %d threads", tv.Error, len(tv.Threads))
	}
	var vcpus []string
	for _, th := range tv.Threads {
		if th.Class == source.VMMThreadClassVCPU {
			vcpus = append(vcpus, fmt.Sprintf("%d %s vcpu%d", th.TID, th.Name, *th.VCPUIndex))
		}
	}
	if d := cmp.Diff([]string{"4252 CPU 0/KVM vcpu0", "4253 CPU 1/KVM vcpu1"}, vcpus); d != "" {
		t.Errorf("vCPU threads (-want +got)\n%s", d)
	}
	if tv.VCPUTotals.Threads != 2 || tv.OtherTotals.Threads != 4 || tv.VCPUTotals.RunNs != 3290841689+1597585 {
		t.Errorf("totals vcpu %v other %v", tv.VCPUTotals, tv.OtherTotals)
	}
	dv := hs.KVM.Debugfs
	if dv.State != source.KVMSourceStateAvailable || dv.Origin != "kvm/4242-11" {
		t.Fatalf("debugfs %v %q %q", dv.State, dv.Origin, dv.Reason)
	}
	for _, c := range dv.Counters {
		if c.Name == "exits" && c.Value != 1234567 {
			t.Errorf("exits = %d, want this VM's 1234567 (not another VM's or the top-level sum)", c.Value)
		}
	}
	if hs.KVM.QMP.State != source.KVMSourceStateNotConfigured {
		t.Errorf("qmp state %v, want not configured", hs.KVM.QMP.State)
	}
	golden(t, "sample_qemu_debugfs54", sampleJSON(t, hs))
}

// TestSampleCloudHypervisorFixture: the VM directory is named after the vmm
// thread (5001), mapped to the process through /proc/5000/task/5001.
func TestSampleCloudHypervisorFixture(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{Class: source.ClassMicroVM, VMMPID: 5000}, "debugfs-6.16")
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if hs.GuestName != "anonymous" || hs.GuestNameSource != "none" {
		t.Errorf("guest = %q from %q, want anonymous", hs.GuestName, hs.GuestNameSource)
	}
	if hs.KVM.Debugfs.Origin != "kvm/5001-7" || hs.KVM.Debugfs.State != source.KVMSourceStateAvailable {
		t.Errorf("debugfs origin %q state %v reason %q", hs.KVM.Debugfs.Origin, hs.KVM.Debugfs.State, hs.KVM.Debugfs.Reason)
	}
	golden(t, "sample_cloudhypervisor_debugfs616", sampleJSON(t, hs))
}

func TestSampleFirecrackerFixtureNoKVMDir(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{Class: source.ClassMicroVM, VMMPID: 6000}, "debugfs-6.16")
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if hs.VMMThreads.VCPUTotals.Threads != 1 || hs.VMMThreads.OtherTotals.Threads != 2 {
		t.Errorf("firecracker totals vcpu %v other %v", hs.VMMThreads.VCPUTotals, hs.VMMThreads.OtherTotals)
	}
	dv := hs.KVM.Debugfs
	if dv.State != source.KVMSourceStateUnavailable || !strings.Contains(dv.Reason, "no KVM VM directory of process 6000") || len(dv.Counters) != 0 {
		t.Errorf("debugfs %v %q %d counters; want unavailable, no zeros", dv.State, dv.Reason, len(dv.Counters))
	}
}

// TestDebugfsLockdownEPERM: under lockdown, 0644 counter files refuse open
// with EPERM and only 0444 gauges read. The view is unavailable with that
// reason; no counter is reported as zero.
func TestDebugfsLockdownEPERM(t *testing.T) {
	r := debugfsReader{
		root:     filepath.Join("testdata", "debugfs-6.16"),
		procRoot: filepath.Join("testdata", "proc"),
		read: func(path string) ([]byte, error) {
			if strings.Contains(path, "/kvm/") && !strings.HasSuffix(path, "/blocking") {
				return nil, &fs.PathError{Op: "open", Path: path, Err: syscall.EPERM}
			}
			return readProcFile(path)
		},
	}
	v := r.readVM(5000)
	if v.State != source.KVMSourceStateUnavailable {
		t.Fatalf("state %v, want unavailable", v.State)
	}
	if !strings.Contains(v.Reason, "operation not permitted") || !strings.Contains(v.Reason, "lockdown") {
		t.Errorf("reason %q does not name EPERM and lockdown", v.Reason)
	}
	var names []string
	for _, c := range v.Counters {
		names = append(names, c.Name+"="+c.Kind.String())
	}
	if d := cmp.Diff([]string{"blocking=gauge"}, names); d != "" {
		t.Errorf("readable counters (-want +got)\n%s", d)
	}
	if len(v.Absent) != 31 {
		t.Errorf("%d absent, want 31 refused files", len(v.Absent))
	}
}

// TestPIDFileFIFOIsRefused: a pid file that would never yield a byte (a FIFO
// with no writer) is refused at once as not a regular file, without
// blocking, and the other views are still read.
func TestPIDFileFIFOIsRefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "srv9", "qemu.pid")
	if err := os.Mkdir(filepath.Dir(fifo), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Release an open that hung (none should).
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	s, err := newSampler(source.SandboxRef{Class: source.ClassMicroVM, VMMPIDFile: fifo}, Config{
		ProcRoot: filepath.Join("testdata", "proc"), DebugfsRoot: filepath.Join("testdata", "debugfs-5.4"),
		ReadTimeout: 200 * time.Millisecond, DisableDebugfsMount: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("sample took %v with a 200ms bound", took)
	}
	if !strings.Contains(hs.VMMThreads.Error, "not a regular file (a FIFO)") {
		t.Errorf("threads error %q, want the FIFO refused", hs.VMMThreads.Error)
	}
	if hs.RunnerKernel.Error != "" || hs.RunnerKernel.Total == nil {
		t.Errorf("runner kernel view lost: %q", hs.RunnerKernel.Error)
	}
	if hs.KVM.Debugfs.State != source.KVMSourceStateUnavailable || !strings.Contains(hs.KVM.Debugfs.Reason, "not a regular file") {
		t.Errorf("debugfs %v %q", hs.KVM.Debugfs.State, hs.KVM.Debugfs.Reason)
	}
	if hs.GuestName != "srv9" {
		t.Errorf("guest %q, want srv9 from the pid file's directory", hs.GuestName)
	}
}

// TestPIDFileContentNeverInErrors: the launcher names the pid file, so it
// may be any file (--vmm-pid-file /etc/shadow). Whatever it holds, no part of
// the host view repeats its content.
func TestPIDFileContentNeverInErrors(t *testing.T) {
	const secret = "root:$6$s3cr3t-hash:19000:0:99999:7:::"
	dir := filepath.Join(t.TempDir(), "srv1")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	short := write("short", secret+"\n")
	long := write("shadow", strings.Repeat(secret+"\n", 8))
	link := filepath.Join(dir, "link.pid")
	if err := os.Symlink(long, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"short secret", short, "not a pid"},
		{"secret larger than a pid file", long, "larger than"},
		{"symlink to the secret", link, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, err := newFixtureSampler(t, source.SandboxRef{VMMPIDFile: tc.path}, "debugfs-5.4").SampleHost(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(hs.VMMThreads.Error, tc.want) {
				t.Errorf("threads error %q, want %q", hs.VMMThreads.Error, tc.want)
			}
			all := string(sampleJSON(t, hs))
			for _, part := range []string{secret, "s3cr3t", "root:"} {
				if strings.Contains(all, part) {
					t.Errorf("the host view repeats the pid file's content %q:\n%s", part, all)
				}
			}
		})
	}
}

func TestPIDFileMalformedAndProcessGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		ref  source.SandboxRef
		want string
	}{
		{"garbage pid file", source.SandboxRef{VMMPIDFile: filepath.Join("testdata", "pidfiles", "garbage", "qemu.pid")}, "not a pid: 10 bytes"},
		{"missing pid file", source.SandboxRef{VMMPIDFile: filepath.Join("testdata", "nope", "qemu.pid")}, "no such file"},
		{"process gone", source.SandboxRef{VMMPID: 31337}, "process 31337 is gone"},
		{"no vmm at all", source.SandboxRef{Class: source.ClassMicroVM}, errNoVMM.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, err := newFixtureSampler(t, tc.ref, "debugfs-5.4").SampleHost(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(hs.VMMThreads.Error, tc.want) || strings.Contains(hs.VMMThreads.Error, "not-a-pid") {
				t.Errorf("threads error %q, want %q and never the file's content", hs.VMMThreads.Error, tc.want)
			}
			if hs.RunnerKernel.Total == nil {
				t.Error("runner kernel view lost")
			}
		})
	}
}

// TestTidReuse: a tid that comes back with another start time is flagged.
func TestTidReuse(t *testing.T) {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "proc"))); err != nil {
		t.Fatal(err)
	}
	s, err := newSampler(source.SandboxRef{VMMPID: 4242}, Config{ProcRoot: root, DebugfsRoot: t.TempDir(), DisableDebugfsMount: true})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.SampleHost(context.Background())
	if len(first.VMMThreads.ReusedTIDs) != 0 {
		t.Fatalf("first sample reused %v", first.VMMThreads.ReusedTIDs)
	}
	p := filepath.Join(root, "4242", "task", "4253", "stat")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte(" 85002 "), []byte(" 99000 "), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	second, _ := s.SampleHost(context.Background())
	if d := cmp.Diff([]int32{4253}, second.VMMThreads.ReusedTIDs); d != "" {
		t.Errorf("reused tids (-want +got)\n%s", d)
	}
}

// fakeQMP serves QMP from the fixture replies on a Unix socket, with an
// event before the vcpu stats reply. mute makes it accept and never speak.
func fakeQMP(t *testing.T, mute bool) string {
	sock, _ := fakeQMPCounting(t, mute)
	return sock
}

// fakeQMPCounting is fakeQMP that also counts query-stats-schemas calls.
func fakeQMPCounting(t *testing.T, mute bool) (string, *atomic.Int32) {
	var schemaCalls atomic.Int32
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	fixture := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "qmp", name+".json"))
		if err != nil {
			t.Error(err)
		}
		return b
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if mute {
					c.Read(make([]byte, 1))
					return
				}
				c.Write(fixture("greeting"))
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var req struct {
						Execute   string         `json:"execute"`
						Arguments map[string]any `json:"arguments"`
					}
					if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
						return
					}
					switch req.Execute {
					case "qmp_capabilities":
						c.Write([]byte(`{"return": {}}` + "\n"))
					case "query-stats":
						if req.Arguments["target"] == "vcpu" {
							c.Write([]byte(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RTC_CHANGE", "data": {"offset": 0}}` + "\n"))
						}
						c.Write(fixture("query-stats-" + req.Arguments["target"].(string)))
					default:
						if req.Execute == "query-stats-schemas" {
							schemaCalls.Add(1)
						}
						c.Write(fixture(req.Execute))
					}
				}
			}()
		}
	}()
	return sock, &schemaCalls
}

func TestQMPQueryStats(t *testing.T) {
	sock, schemaCalls := fakeQMPCounting(t, false)
	s := newFixtureSampler(t, source.SandboxRef{VMMPID: 4242, QMPSocket: sock}, "debugfs-5.4")
	hs, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	q := hs.KVM.QMP
	if q.State != source.KVMSourceStateAvailable {
		t.Fatalf("qmp %v %q", q.State, q.Reason)
	}
	var got []string
	for _, c := range q.Counters {
		if c.Scope != "vm" {
			got = append(got, fmt.Sprintf("%s %s %s %d %s", c.Scope, c.Name, c.Kind, c.Value, c.Unit))
		}
	}
	want := []string{
		"vcpu0 blocking gauge 1 boolean", "vcpu0 exits cumulative 7592 count", "vcpu0 guest_mode gauge 0 boolean",
		"vcpu0 halt_exits cumulative 759 count", "vcpu0 halt_wait_ns cumulative 7592000 ns", "vcpu0 halt_wakeup cumulative 690 count",
		"vcpu0 insn_emulation cumulative 300 count", "vcpu0 io_exits cumulative 900 count", "vcpu0 pf_taken cumulative 2000 count",
		"vcpu1 blocking gauge 1 boolean", "vcpu1 exits cumulative 1204 count", "vcpu1 guest_mode gauge 0 boolean",
		"vcpu1 halt_exits cumulative 120 count", "vcpu1 halt_wait_ns cumulative 1204000 ns", "vcpu1 halt_wakeup cumulative 109 count",
		"vcpu1 insn_emulation cumulative 301 count", "vcpu1 io_exits cumulative 901 count", "vcpu1 pf_taken cumulative 2001 count",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("vcpu counters (-want +got)\n%s", d)
	}
	q.Origin = "<test socket>"
	golden(t, "sample_qemu_qmp", sampleJSON(t, hs))

	// The schema is cached per socket and VMM pid: the second sample asks
	// only for the values and still tags every counter.
	hs2, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hs2.KVM.QMP.Origin = "<test socket>"
	if d := cmp.Diff(hs, hs2); d != "" {
		t.Errorf("second sample differs (-first +second)\n%s", d)
	}
	if n := schemaCalls.Load(); n != 1 {
		t.Errorf("query-stats-schemas asked %d times, want 1", n)
	}
}

func TestQMPMuteServerIsBounded(t *testing.T) {
	sock := fakeQMP(t, true)
	s, err := newSampler(source.SandboxRef{QMPSocket: sock}, Config{ProcRoot: filepath.Join("testdata", "proc"), ReadTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	hs, _ := s.SampleHost(context.Background())
	if time.Since(start) > 2*time.Second {
		t.Errorf("mute QMP took %v", time.Since(start))
	}
	if hs.KVM.QMP.State != source.KVMSourceStateUnavailable || hs.KVM.QMP.Reason == "" {
		t.Errorf("qmp %v %q, want unavailable with a reason", hs.KVM.QMP.State, hs.KVM.QMP.Reason)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
}

func TestQMPNoSocket(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{VMMPID: 4242, QMPSocket: filepath.Join(t.TempDir(), "missing.sock")}, "debugfs-5.4")
	hs, _ := s.SampleHost(context.Background())
	if q := hs.KVM.QMP; q.State != source.KVMSourceStateUnavailable || !strings.Contains(q.Reason, "no such file") {
		t.Errorf("qmp %v %q", q.State, q.Reason)
	}
}

func TestSampleHostCanceledContext(t *testing.T) {
	s := newFixtureSampler(t, source.SandboxRef{VMMPID: 4242}, "debugfs-5.4")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.SampleHost(ctx); !errors.Is(err, source.ErrTimeout) {
		t.Errorf("err = %v, want ErrTimeout", err)
	}
}

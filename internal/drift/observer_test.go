package drift

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

type stubSource struct {
	r   source.Reading
	err error
}

func (s stubSource) Sample(context.Context) (source.Reading, error) { return s.r, s.err }
func (s stubSource) Close() error                                   { return nil }

// procTree writes a fake /proc with the given pid -> cmdline entries.
func procTree(t *testing.T, procs map[int]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, cmdline := range procs {
		dir := filepath.Join(root, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o644)
		os.WriteFile(filepath.Join(dir, "cgroup"), []byte("4:memory:/statstest\n0::/\n"), 0o644)
		writeStat(t, root, pid, 86000)
	}
	return root
}

// writeStat writes <root>/<pid>/stat with the given start time, as /proc
// has one for every process.
func writeStat(t *testing.T, root string, pid int, start uint64) {
	t.Helper()
	line := fmt.Sprintf("%d (proc) S 1 %d %d 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 %d 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n", pid, pid, pid, start)
	if err := os.WriteFile(filepath.Join(root, fmt.Sprint(pid), "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

func summary(o Observation) []string {
	var out []string
	for _, f := range o.Findings {
		out = append(out, f.Kind.String()+" "+f.Subject)
	}
	for c, why := range o.Skipped {
		_ = why
		out = append(out, "skipped "+string(c))
	}
	sort.Strings(out)
	return out
}

func u32(v uint32) *uint32 { return &v }
func u64(v uint64) *uint64 { return &v }

func TestSystemObserver(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	epoch := now.Add(-time.Hour).UnixNano()
	qemu := "qemu-system-x86_64\x00-name\x00guest=srv1,debug-threads=on\x00"
	gvByPath := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest"}
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/a.sock:1024", ContainerIDs: []string{"c1", "c2"}}

	pidFileDir := t.TempDir()
	pidFile := func(content string) string {
		p := filepath.Join(pidFileDir, "srv1", "qemu.pid")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o644)
		return p
	}

	for _, tc := range []struct {
		name  string
		ref   source.SandboxRef
		src   source.Source
		procs map[int]string
		want  []string
	}{
		{name: "healthy gvisor", ref: gvByPath, src: stubSource{r: source.Reading{SandboxProcesses: u32(3)}}, want: nil},
		{name: "dead sandbox", ref: gvByPath, src: stubSource{r: source.Reading{SandboxProcesses: u32(0)}}, want: []string{"SANDBOX_DEAD /statstest"}},
		{name: "cgroup gone", ref: gvByPath, src: stubSource{err: fmt.Errorf("x: %w: %w", source.ErrNotMeasurable, source.ErrSandboxGone)}, want: []string{"CGROUP_GONE /statstest"}},
		{name: "cgroup unreadable", ref: gvByPath, src: stubSource{err: fmt.Errorf("%w: memory.current", source.ErrTimeout)}, want: []string{"skipped sandbox cgroup"}},
		{name: "sentry gone", ref: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 77}, src: stubSource{r: source.Reading{SandboxProcesses: u32(3)}}, procs: map[int]string{1: "init\x00"}, want: []string{"SENTRY_GONE pid 77"}},
		{name: "sentry alive", ref: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 77}, src: stubSource{r: source.Reading{SandboxProcesses: u32(3)}}, procs: map[int]string{77: "runsc-sandbox\x00"}, want: nil},
		{name: "agent silent past grace", ref: vm, src: stubSource{err: fmt.Errorf("dial: %w", source.ErrNotMeasurable)}, want: []string{"AGENT_SILENT hvsock:///run/a.sock:1024", "skipped agent containers"}},
		{name: "unknown container", ref: vm, src: stubSource{r: source.Reading{UnreadContainers: []source.ContainerError{{ID: "c2", Reason: source.ReasonUnknownContainer}, {ID: "c1", Reason: "deadline"}}}}, want: []string{"CONTAINER_UNKNOWN c2"}},
		{name: "every container unknown: the agent answered", ref: vm, src: stubSource{err: &source.UnreadError{
			Containers: []source.ContainerError{{ID: "c1", Reason: source.ReasonUnknownContainer}, {ID: "c2", Reason: source.ReasonUnknownContainer}},
			Err:        fmt.Errorf("no container could be read: %w", source.ErrNotMeasurable)}}, want: []string{"CONTAINER_UNKNOWN c1", "CONTAINER_UNKNOWN c2"}},
		{name: "vmm pid file gone", ref: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: vm.AgentAddress, ContainerIDs: vm.ContainerIDs, VMMPIDFile: filepath.Join(pidFileDir, "none", "qemu.pid")}, src: stubSource{}, want: []string{"VMM_GONE " + filepath.Join(pidFileDir, "none", "qemu.pid"), "skipped stray vmm"}},
		{name: "vmm pid dead", ref: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: vm.AgentAddress, ContainerIDs: vm.ContainerIDs, VMMPIDFile: pidFile("4242\n")}, src: stubSource{}, procs: map[int]string{1: "init\x00"}, want: []string{"VMM_GONE " + filepath.Join(pidFileDir, "srv1", "qemu.pid")}},
		{name: "vmm alive, stray claims its guest", ref: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: vm.AgentAddress, ContainerIDs: vm.ContainerIDs, VMMPIDFile: pidFile("4242\n")}, src: stubSource{}, procs: map[int]string{4242: qemu, 5151: qemu, 6000: "qemu-system-x86_64\x00-name\x00guest=srv2\x00"}, want: []string{"STRAY_VMM pid 5151"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewSystemObserver(procTree(t, tc.procs), time.Second, 15*time.Minute, func() time.Time { return now })
			b := &identity.Binding{Identity: identity.Identity{ActorUID: "a"}, Ref: tc.ref, EpochUnixNano: epoch, Source: tc.src}
			if diff := cmp.Diff(tc.want, summary(o.Observe(context.Background(), b))); diff != "" {
				t.Errorf("observation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAgentSilentOnlyPastGrace(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := now
	o := NewSystemObserver(t.TempDir(), time.Second, 15*time.Minute, func() time.Time { return clock })
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/a.sock:1024", ContainerIDs: []string{"c1"}}
	b := &identity.Binding{Ref: vm, EpochUnixNano: now.Add(-time.Hour).UnixNano(), Source: stubSource{}}
	o.Observe(context.Background(), b) // answered now
	b.Source = stubSource{err: source.ErrNotMeasurable}
	clock = now.Add(10 * time.Minute)
	if got := summary(o.Observe(context.Background(), b)); len(got) != 1 || got[0] != "skipped agent containers" {
		t.Fatalf("within grace: %v", got)
	}
	clock = now.Add(16 * time.Minute)
	if got := summary(o.Observe(context.Background(), b)); len(got) != 2 || got[0] != "AGENT_SILENT hvsock:///run/a.sock:1024" {
		t.Fatalf("past grace: %v", got)
	}
}

// TestHungPidFileIsSkipped puts a FIFO in place of the VMM pid file: the read
// times out and the VMM comparison is skipped, not judged.
func TestHungPidFileIsSkipped(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "srv1", "qemu.pid")
	os.MkdirAll(filepath.Dir(fifo), 0o755)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	o := NewSystemObserver(t.TempDir(), 100*time.Millisecond, time.Minute, nil)
	ref := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///a:1", ContainerIDs: []string{"c"}, VMMPIDFile: fifo}
	start := time.Now()
	got := o.Observe(context.Background(), &identity.Binding{Ref: ref, Source: stubSource{}})
	if time.Since(start) > 2*time.Second {
		t.Fatal("a hung pid file held the check")
	}
	if _, skipped := got.Skipped[cmpVMM]; !skipped || len(got.Findings) != 0 {
		t.Fatalf("observation = %+v, want the VMM comparison skipped", got)
	}
}

func TestSentryMoved(t *testing.T) {
	proc := procTree(t, map[int]string{77: "runsc-sandbox\x00"})
	o := NewSystemObserver(proc, time.Second, time.Minute, nil)
	b := &identity.Binding{Ref: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 77}, EpochUnixNano: 1, Source: stubSource{r: source.Reading{SandboxProcesses: u32(2)}}}
	if got := summary(o.Observe(context.Background(), b)); len(got) != 0 {
		t.Fatalf("first look: %v", got)
	}
	os.WriteFile(filepath.Join(proc, "77", "cgroup"), []byte("4:memory:/elsewhere\n0::/\n"), 0o644)
	if diff := cmp.Diff([]string{"SENTRY_MOVED pid 77"}, summary(o.Observe(context.Background(), b))); diff != "" {
		t.Errorf("after the move (-want +got):\n%s", diff)
	}
	// A new epoch takes a new baseline.
	b.EpochUnixNano = 2
	if got := summary(o.Observe(context.Background(), b)); len(got) != 0 {
		t.Fatalf("new epoch: %v", got)
	}
}

// TestBoundVMMUnknownIsNoStray: a pid file that names no pid this cycle
// (empty, being rewritten) must not make the bound QEMU look like a stray.
func TestBoundVMMUnknownIsNoStray(t *testing.T) {
	qemu := "qemu-system-x86_64\x00-name\x00guest=srv1\x00"
	pidFile := filepath.Join(t.TempDir(), "srv1", "qemu.pid")
	os.MkdirAll(filepath.Dir(pidFile), 0o755)
	os.WriteFile(pidFile, nil, 0o644)
	o := NewSystemObserver(procTree(t, map[int]string{4242: qemu}), time.Second, time.Minute, nil)
	ref := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///a:1", ContainerIDs: []string{"c"}, VMMPIDFile: pidFile}
	got := o.Observe(context.Background(), &identity.Binding{Ref: ref, Source: stubSource{}})
	if diff := cmp.Diff([]string{"skipped stray vmm", "skipped vmm process"}, summary(got)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestOOMKilled: the first look of an epoch takes the OOM kill count as its
// baseline; a dead sandbox whose count rose since is OOM_KILLED (instead of
// SANDBOX_DEAD), one whose count did not is SANDBOX_DEAD, and so is one
// already dead with kills at the first look (they may be an earlier
// epoch's). A new epoch takes a new baseline.
func TestOOMKilled(t *testing.T) {
	o := NewSystemObserver(t.TempDir(), time.Second, time.Minute, nil)
	reading := func(procs uint32, kills *uint64) source.Reading {
		r := source.Reading{SandboxProcesses: u32(procs)}
		if kills != nil {
			r.Memory = &source.MemorySignals{OOMKills: kills}
		}
		return r
	}
	b := &identity.Binding{Ref: source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest"}, EpochUnixNano: 1}
	for _, step := range []struct {
		name  string
		epoch int64
		r     source.Reading
		want  []string
	}{
		{name: "alive, baseline 0", epoch: 1, r: reading(3, u64(0))},
		{name: "alive, a child OOM-killed, the rest lives", epoch: 1, r: reading(2, u64(1))},
		{name: "dead, kills rose", epoch: 1, r: reading(0, u64(2)), want: []string{"OOM_KILLED /statstest"}},
		{name: "dead, no OOM count offered", epoch: 1, r: reading(0, nil), want: []string{"SANDBOX_DEAD /statstest"}},
		{name: "new epoch, dead with kills at the first look", epoch: 2, r: reading(0, u64(2)), want: []string{"SANDBOX_DEAD /statstest"}},
		{name: "same epoch, still no rise", epoch: 2, r: reading(0, u64(2)), want: []string{"SANDBOX_DEAD /statstest"}},
		{name: "new epoch, alive", epoch: 3, r: reading(1, u64(2))},
		{name: "killed in it", epoch: 3, r: reading(0, u64(3)), want: []string{"OOM_KILLED /statstest"}},
	} {
		b.EpochUnixNano, b.Source = step.epoch, stubSource{r: step.r}
		obs := o.Observe(context.Background(), b)
		if diff := cmp.Diff(step.want, summary(obs)); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step.name, diff)
		}
		for _, f := range obs.Findings {
			t.Logf("%s: %s %s", step.name, f.Kind, f.Detail)
		}
	}
}

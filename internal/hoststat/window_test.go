package hoststat

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// windowPair returns a fixture sample and a copy 10 s later in which the
// vCPUs ran, one debugfs counter was reset, a thread exited, a thread
// appeared, and a gauge fell (a gauge is never differenced).
func windowPair(t *testing.T) (before, after *sandboxstatsv1.HostStats) {
	t.Helper()
	sock := fakeQMP(t, false)
	s := fixtureSampler(t, source.SandboxRef{VMMPIDFile: filepath.Join("testdata", "srv1", "qemu.pid"), QMPSocket: sock}, "debugfs-5.4")
	before, err := s.SampleHost(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before.Kvm.Qmp.Origin = "<test socket>"
	after = proto.Clone(before).(*sandboxstatsv1.HostStats)
	after.ObservedAtUnixNano += int64(10 * time.Second)
	k := after.RunnerKernel.Total
	k.UserUsec += 12_000_000
	k.SystemUsec += 3_000_000
	k.IdleUsec += 4_500_000
	k.StealUsec += 500_000
	k.GuestUsec += 9_000_000
	var threads []*sandboxstatsv1.VmmThread
	for _, th := range after.VmmThreads.Threads {
		switch th.Name {
		case "CPU 0/KVM":
			th.StimeUsec += 9_000_000
			*th.RunNs += 9_100_000_000
			*th.RunDelayNs += 400_000_000
		case "CPU 1/KVM":
			th.StimeUsec += 100_000
			*th.RunNs += 150_000_000
			*th.RunDelayNs += 2_000_000
		case "call_rcu":
			continue // exited
		}
		threads = append(threads, th)
	}
	threads = append(threads, &sandboxstatsv1.VmmThread{Pid: 4242, Tid: 4300, Name: "worker", StartTimeTicks: 86000, Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_OTHER})
	after.VmmThreads.Threads = threads
	for _, c := range after.Kvm.Debugfs.Counters {
		switch c.Name {
		case "exits":
			c.Value += 70_000
		case "halt_exits":
			c.Value = 5 // reset (someone wrote 0)
		case "largepages":
			c.Value = 1 // gauge fell: not a finding, not a row
		}
	}
	for _, c := range after.Kvm.Qmp.Counters {
		if c.Name == "exits" {
			c.Value += 385
		}
	}
	return before, after
}

func TestWindowGolden(t *testing.T) {
	before, after := windowPair(t)
	rep := Window(before, after, 10*time.Second)
	var b bytes.Buffer
	if err := WriteWindowTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "window_qemu", b.Bytes())
	j, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "window_qemu_json", append(j, '\n'))
}

func TestWindowRules(t *testing.T) {
	before, after := windowPair(t)
	rep := Window(before, after, 0) // elapsed from observed_at: 10 s
	if rep.Elapsed != 10*time.Second {
		t.Errorf("elapsed %v, want 10s from observed_at", rep.Elapsed)
	}
	rows := map[string]WindowRow{}
	for _, r := range rep.Rows {
		rows[r.Layer+"|"+r.Name] = r
	}
	for name, want := range map[string]float64{
		"runner kernel|cpu user":               1_200_000,
		"VMM threads|4252 CPU 0/KVM run":       910_000_000,
		"VMM threads|4252 CPU 0/KVM cpu":       900_000,
		"KVM debugfs|vcpu-sum exits":           7_000,
		"KVM qmp|vcpu0 exits":                  38.5,
		"VMM threads|4253 CPU 1/KVM run_delay": 200_000,
	} {
		if r, ok := rows[name]; !ok || r.RatePerSec != want {
			t.Errorf("%s: rate %v (present %v), want %v", name, r.RatePerSec, ok, want)
		}
	}
	for _, never := range []string{"KVM debugfs|vcpu-sum halt_exits", "KVM debugfs|vm largepages", "KVM debugfs|vm max_mmu_page_hash_collisions", "KVM qmp|vm pages_4k", "VMM threads|4300 worker cpu"} {
		if _, ok := rows[never]; ok {
			t.Errorf("%s must not be differenced", never)
		}
	}
	all := strings.Join(rep.Findings, "\n")
	for _, want := range []string{"halt_exits decreased from 4000 to 5", "4250 \"call_rcu\" exited", "4300 \"worker\" appeared"} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "largepages") {
		t.Errorf("a gauge produced a finding:\n%s", all)
	}
}

func TestWindowShortViews(t *testing.T) {
	before, after := windowPair(t)
	after.RunnerKernel = &sandboxstatsv1.RunnerKernelView{Error: "/proc/stat: timed out"}
	after.Kvm.Debugfs = unavailable(sandboxstatsv1.KvmSource_KVM_SOURCE_DEBUGFS, "", "EPERM")
	after.Kvm.Debugfs.Counters = nil
	rep := Window(before, after, 10*time.Second)
	for _, r := range rep.Rows {
		if r.Layer == LayerRunnerKernel || r.Layer == LayerKVMDebugfs {
			t.Errorf("row from a short view: %+v", r)
		}
	}
	all := strings.Join(rep.Findings, "\n")
	if !strings.Contains(all, "runner kernel: not differenced") || !strings.Contains(all, "KVM debugfs: not differenced") {
		t.Errorf("findings:\n%s", all)
	}
}

package rate

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// hostSample loads testdata/host_qemu.json: a HostStats as hoststat's
// sampler produced it for a 2-vCPU QEMU (its srv1 fixture with debugfs 5.4
// and a fake QMP), every view present.
func hostSample(t *testing.T) *sandboxstatsv1.HostStats {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "host_qemu.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hs sandboxstatsv1.HostStats
	if err := protojson.Unmarshal(b, &hs); err != nil {
		t.Fatal(err)
	}
	return &hs
}

// windowPair returns the sample and a copy 10 s later in which the vCPUs
// ran, one debugfs counter was reset, a thread exited, a thread appeared,
// and a gauge fell (a gauge is never differenced).
func windowPair(t *testing.T) (before, after *sandboxstatsv1.HostStats) {
	t.Helper()
	before = hostSample(t)
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

func TestWindowRules(t *testing.T) {
	before, after := windowPair(t)
	rep := Window(before, after, 0) // elapsed from observed_at: 10 s
	if rep.Elapsed != 10*time.Second {
		t.Errorf("elapsed %v, want 10s from observed_at", rep.Elapsed)
	}
	if rep.GuestName != "srv1" {
		t.Errorf("guest name %q, want srv1", rep.GuestName)
	}
	rows := map[string]WindowRow{}
	perLayer := map[string]int{}
	for _, r := range rep.Rows {
		rows[r.Layer+"|"+r.Name] = r
		perLayer[r.Layer]++
		if r.Delta != r.After-r.Before || r.After < r.Before {
			t.Errorf("%s %s: before %d after %d delta %d", r.Layer, r.Name, r.Before, r.After, r.Delta)
		}
	}
	for name, want := range map[string]float64{
		"runner kernel|cpu user":                  1_200_000,
		"runner kernel|cpu nice":                  0,
		"VMM threads|4252 CPU 0/KVM run":          910_000_000,
		"VMM threads|4252 CPU 0/KVM cpu":          900_000,
		"VMM threads|4253 CPU 1/KVM run_delay":    200_000,
		"VMM threads|total vcpu threads (2) cpu":  910_000,
		"VMM threads|total vcpu threads (2) run":  925_000_000,
		"VMM threads|total other threads (3) run": 0, // call_rcu exited, worker appeared: neither counts
		"KVM debugfs|vcpu-sum exits":              7_000,
		"KVM qmp|vcpu0 exits":                     38.5,
		"KVM qmp|vcpu1 exits":                     38.5,
	} {
		if r, ok := rows[name]; !ok || r.RatePerSec != want {
			t.Errorf("%s: rate %v (present %v), want %v", name, r.RatePerSec, ok, want)
		}
	}
	// Every cumulative counter present in both samples is a row, and
	// nothing else: 10 kernel columns; 17 of debugfs's 18 counters (one
	// reset); QMP's 22.
	for layer, want := range map[string]int{LayerRunnerKernel: 10, LayerKVMDebugfs: 17, LayerKVMQMP: 22} {
		if perLayer[layer] != want {
			t.Errorf("%s: %d rows, want %d", layer, perLayer[layer], want)
		}
	}
	for _, never := range []string{"KVM debugfs|vcpu-sum halt_exits", "KVM debugfs|vm largepages", "KVM debugfs|vm max_mmu_page_hash_collisions", "KVM qmp|vm pages_4k", "VMM threads|4300 worker cpu", "VMM threads|4250 call_rcu cpu"} {
		if _, ok := rows[never]; ok {
			t.Errorf("%s must not be differenced", never)
		}
	}
	want := []string{
		`VMM threads: thread 4300 "worker" appeared during the window: not differenced`,
		`VMM threads: thread 4250 "call_rcu" exited during the window: its last interval is lost`,
		`KVM debugfs vcpu-sum halt_exits decreased from 4000 to 5 count: reset or restart, no rate`,
	}
	if diff := cmp.Diff(want, rep.Findings); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
	for _, l := range []string{LayerRunnerKernel, LayerVMMThreads, LayerKVMDebugfs, LayerKVMQMP} {
		if rep.Legends[l] == "" {
			t.Errorf("no legend for %s", l)
		}
	}
}

func TestWindowShortViews(t *testing.T) {
	before, after := windowPair(t)
	after.RunnerKernel = &sandboxstatsv1.RunnerKernelView{Error: "/proc/stat: timed out"}
	after.Kvm.Debugfs = &sandboxstatsv1.KvmSourceView{
		Source: sandboxstatsv1.KvmSource_KVM_SOURCE_DEBUGFS,
		State:  sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE,
		Reason: "EPERM",
	}
	rep := Window(before, after, 10*time.Second)
	for _, r := range rep.Rows {
		if r.Layer == LayerRunnerKernel || r.Layer == LayerKVMDebugfs {
			t.Errorf("row from a short view: %+v", r)
		}
	}
	all := strings.Join(rep.Findings, "\n")
	for _, want := range []string{
		`runner kernel: not differenced: before "", after "/proc/stat: timed out"`,
		`KVM debugfs: not differenced: before available "", after unavailable "EPERM"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
}

// TestWindowNeverNegative: a counter that went down is a finding, never a
// row, in every layer; a VM replaced under the window (new origin) is not
// differenced at all.
func TestWindowNeverNegative(t *testing.T) {
	before, after := windowPair(t)
	after.RunnerKernel.Total.UserUsec = 1
	after.VmmThreads.Threads[0].UtimeUsec = 0 // qemu-system-x86: 120000 before
	after.VmmThreads.Threads[0].StimeUsec = 0
	after.Kvm.Qmp.Origin = "another VM"
	rep := Window(before, after, 10*time.Second)
	for _, r := range rep.Rows {
		if r.RatePerSec < 0 || r.After < r.Before {
			t.Errorf("negative row %+v", r)
		}
		if r.Layer == LayerKVMQMP {
			t.Errorf("row from a replaced VM: %+v", r)
		}
	}
	all := strings.Join(rep.Findings, "\n")
	for _, want := range []string{
		"runner kernel cpu user decreased from 12345670000 to 1 usec",
		"VMM threads 4242 qemu-system-x86 cpu decreased from 420000 to 0 usec",
		`KVM qmp: origin changed from "<test socket>" to "another VM" (a new VM): not differenced`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
}

// TestWindowTidReused: a thread whose tid now belongs to another thread (a
// new start time) is a finding, never differenced against the old one.
func TestWindowTidReused(t *testing.T) {
	before := hostSample(t)
	after := proto.Clone(before).(*sandboxstatsv1.HostStats)
	after.ObservedAtUnixNano += int64(10 * time.Second)
	th := after.VmmThreads.Threads[0]
	th.StartTimeTicks += 500
	th.UtimeUsec = 0 // a new thread's counter starts again
	r := Window(before, after, 0)
	want := "tid " + strconv.Itoa(int(th.Tid)) + " reused"
	if !slices.ContainsFunc(r.Findings, func(f string) bool { return strings.Contains(f, want) }) {
		t.Fatalf("findings %q lack %q", r.Findings, want)
	}
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Name, strconv.Itoa(int(th.Tid))+" ") {
			t.Errorf("reused tid differenced: %+v", row)
		}
	}
}

package server

// The largest answers statsd can be made to give (issue 16): a micro-VM
// whose guest agent answers at every cap the micro-VM source lets through,
// a host view at every cap hoststat lets through, and the ended activations
// at identity's caps. Each response type is measured with proto.Size.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The caps of the edges the worst case is built at.
const (
	worstContainers   = identity.MaxContainerIDs // 25 container ids
	worstContainerID  = 256                      // bytes, identity's cut
	worstInterfaces   = 64                       // microvm's cap of interfaces
	worstIfaceName    = 64                       // bytes, microvm's cut
	worstDevices      = 64                       // microvm's cap of devices
	worstQMPCounters  = 8192                     // hoststat's cap of QMP statistics
	worstQMPName      = 128                      // bytes, hoststat's cut of names and QOM paths
	worstHostCPUs     = 256                      // a large host's /proc/stat
	worstVMMThreads   = 1024                     // a VMM's threads: no cap (the VMM chooses)
	worstAgentMessage = 4 << 10                  // an agent error message (cut to 256 where it enters)
)

// worstID is the i-th container id: 256 bytes of printable ASCII.
func worstID(i int) string {
	p := fmt.Sprintf("c%02d-", i)
	return p + strings.Repeat("x", worstContainerID-len(p))
}

// hostileReply is one container's reply with every list the guest chooses
// at its cap and every figure missing that can be: no memory peak, a
// memory limit of 0 (unreadable), no throttling, no pids.
func hostileReply() *katagrpc.StatsContainerResponse {
	c := kataagentfake.Container{UsageBytes: math.MaxUint64 / 64, NoThrottling: true, NoPids: true}
	for i := range worstInterfaces {
		name := fmt.Sprintf("eth%02d-", i)
		c.Network = append(c.Network, &katagrpc.NetworkStats{
			Name:    name + strings.Repeat("n", worstIfaceName-len(name)),
			RxBytes: math.MaxUint64, RxPackets: math.MaxUint64, RxErrors: math.MaxUint64, RxDropped: math.MaxUint64,
			TxBytes: math.MaxUint64, TxPackets: math.MaxUint64, TxErrors: math.MaxUint64, TxDropped: math.MaxUint64,
		})
	}
	for i := range worstDevices {
		c.Devices = append(c.Devices, kataagentfake.Device{Major: math.MaxUint32, Minor: uint64(math.MaxUint32 - i),
			ReadBytes: math.MaxUint64 / 2, WriteBytes: math.MaxUint64 / 2, ReadIOs: math.MaxUint64 / 2, WriteIOs: math.MaxUint64 / 2})
	}
	r := kataagentfake.V2(c)
	r.CgroupStats.MemoryStats.Usage.Limit = 0
	return r
}

// hostileGuest starts a fake agent for 25 containers of 256-byte ids. With
// partial, all but the first container fail with a 4 KiB message and its
// version is 256 quote characters (not a release number: the CPU unit is
// unknown, and every reason naming it quotes it); such readings are never
// an epoch's baseline. Without, the agent is of a known version, so the
// first read is the baseline and every sample carries its first_read (the
// lists again).
func hostileGuest(t testing.TB, partial bool) (*kataagentfake.Agent, []string) {
	t.Helper()
	var opts []kataagentfake.Option
	if partial {
		opts = append(opts, kataagentfake.WithVersion(strings.Repeat(`"`, 256)))
	}
	var ids []string
	for i := range worstContainers {
		id := worstID(i)
		ids = append(ids, id)
		if partial && i > 0 {
			opts = append(opts, kataagentfake.WithContainerError(id, errors.New(strings.Repeat("e", worstAgentMessage))))
			continue
		}
		opts = append(opts, kataagentfake.WithContainer(id, hostileReply()))
	}
	return kataagentfake.New(t, t.TempDir(), opts...), ids
}

// hostileHostView is a host view at hoststat's caps: a large host's CPUs, a
// VMM with 1,024 threads, the debugfs counters, and 8,192 QMP statistics
// (the cap) named by 128-byte names and QOM paths, each with a 128-byte unit
// (hoststat cuts a schema's unit to 128 bytes where it enters).
func hostileHostView() *source.HostStats {
	big := uint64(1) << 60
	h := &source.HostStats{ObservedAtUnixNano: fixedNow.UnixNano(), GuestName: strings.Repeat("g", 255), GuestNameSource: "qemu-cmdline",
		RunnerKernel: &source.RunnerKernelView{Legend: strings.Repeat("L", 300)},
		VMMThreads: &source.VMMThreadsView{Legend: strings.Repeat("L", 300), ProcessSource: "vmm_pid_file /run/vc/" + strings.Repeat("p", 100), PIDs: []int32{math.MaxInt32},
			VCPUTotals:  &source.VMMThreadTotals{Class: source.VMMThreadClassVCPU, Threads: worstVMMThreads, UtimeUsec: big, StimeUsec: big, GuestTimeUsec: big, RunNs: big, RunDelayNs: big},
			OtherTotals: &source.VMMThreadTotals{Class: source.VMMThreadClassOther, UtimeUsec: big}, UserHZ: 100},
		KVM: &source.KVMView{Legend: strings.Repeat("L", 300),
			Debugfs: &source.KVMSourceView{Source: source.KVMSourceDebugfs, State: source.KVMSourceStateAvailable, Origin: "kvm/2147483647-11"},
			QMP:     &source.KVMSourceView{Source: source.KVMSourceQMP, State: source.KVMSourceStateAvailable, Origin: "/run/vc/" + strings.Repeat("q", 100)}},
	}
	times := func(name string) source.CPUTimes {
		return source.CPUTimes{CPU: name, UserUsec: big, NiceUsec: big, SystemUsec: big, IdleUsec: big, IowaitUsec: big, IRQUsec: big,
			SoftIRQUsec: big, StealUsec: big, GuestUsec: big, GuestNiceUsec: big}
	}
	total := times("cpu")
	h.RunnerKernel.Total = &total
	for i := range worstHostCPUs {
		h.RunnerKernel.PerCPU = append(h.RunnerKernel.PerCPU, times(fmt.Sprintf("cpu%d", i)))
	}
	for i := range worstVMMThreads {
		idx := int32(i)
		h.VMMThreads.Threads = append(h.VMMThreads.Threads, source.VMMThread{PID: math.MaxInt32, TID: math.MaxInt32 - int32(i),
			Name: fmt.Sprintf("CPU %d/KVM", i), StartTimeTicks: big, Class: source.VMMThreadClassVCPU, VCPUIndex: &idx,
			UtimeUsec: big, StimeUsec: big, GuestTimeUsec: big, RunNs: &big, RunDelayNs: &big, RunCount: &big})
	}
	for i := range 60 {
		h.KVM.Debugfs.Counters = append(h.KVM.Debugfs.Counters, source.KVMCounter{Name: fmt.Sprintf("debugfs_counter_%02d", i),
			Kind: source.KVMCounterKindCumulative, Scope: "vcpu-sum", Value: big, Unit: "count"})
	}
	unit := strings.Repeat("u", worstQMPName)
	for i := range worstQMPCounters {
		scope := "vm"
		if i >= 64 {
			path := fmt.Sprintf("qom:/machine/peripheral/%d/", i/64)
			scope = path + strings.Repeat("p", 4+worstQMPName-len(path))
		}
		name := fmt.Sprintf("s%d-", i)
		h.KVM.QMP.Counters = append(h.KVM.QMP.Counters, source.KVMCounter{Name: name + strings.Repeat("s", worstQMPName-len(name)),
			Kind: source.KVMCounterKindCumulative, Scope: scope, Value: big, Unit: unit})
	}
	return h
}

// worstHarness is a harness whose Run opens a real micro-VM source on
// the hostile guest, and whose host sampler answers the hostile host view.
func worstHarness(t testing.TB, partial bool) (*harness, *sandboxstatsv1.SandboxRef) {
	t.Helper()
	agent, ids := hostileGuest(t, partial)
	host := &fakeHost{view: hostileHostView()}
	h := newHarness(t, func(c *identity.Config) {
		c.EndedRetention = 1 << 62 // the harness clock moves a second a call
		c.BaselineRetry = time.Millisecond
		c.Open = func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			src, err := microvm.Open(ref, microvm.Config{})
			return src, host, err
		}
	})
	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
		AgentAddress: agent.Address(), ContainerIds: ids}
	return h, ref
}

// runWithBaseline runs identA and waits for its epoch's baseline (the
// guest agent's first whole read), unless partial: a partial reading is
// never a baseline.
func (h *harness) runWithBaseline(t testing.TB, ref *sandboxstatsv1.SandboxRef, partial bool) {
	t.Helper()
	h.run(t, identA, ref)
	if partial {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.store.Bound("actor-a").Activation.Baseline() == nil {
		if time.Now().After(deadline) {
			t.Fatal("no baseline within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// worstSizes measures each response type at the worst case: with the
// workload bound, and with the most ended activations identity keeps; the
// ended activations are read page by page ("ListEndedActivations" is the
// largest page, "pages" how many, "records reached" the records they held).
// cuts lists the fields the answers name as cut.
func worstSizes(t *testing.T, partial bool) (sizes map[string]int, cuts map[string][]string) {
	t.Helper()
	ctx := context.Background()
	h, ref := worstHarness(t, partial)
	sizes, cuts = map[string]int{}, map[string][]string{}
	measure := func(name string, m proto.Message, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sizes[name] = max(sizes[name], proto.Size(m))
	}
	cutsOf := func(name string, as []*sandboxstatsv1.AbsentValue) {
		cuts[name] = nil
		for _, a := range as {
			if strings.HasPrefix(a.GetReason(), cutPrefix) {
				cuts[name] = append(cuts[name], a.GetField())
			}
		}
	}
	// 64 activations ended (identity keeps at most 64, and at most 1 MiB
	// of them as JSON), then one bound.
	for range identity.DefaultEndedMax {
		h.runWithBaseline(t, ref, partial)
		resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: identA.GetActorUid()})
		if err != nil {
			t.Fatal(err)
		}
		measure("CheckpointWorkload", resp, nil)
		cutsOf("the last ended record's final", resp.GetEnded().GetFinal().GetAbsent())
	}
	h.runWithBaseline(t, ref, partial)
	w, err := h.stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: identA.GetActorUid(), IncludeHost: true})
	measure("StatsWorkload", w, err)
	sizes["one sample"] = proto.Size(w.GetSample())
	cutsOf("StatsWorkload", w.GetSample().GetAbsent())
	nh, err := h.stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: identA.GetActorUid()})
	measure("StatsWorkload, no host", nh, err)
	a, err := h.stats.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{IncludeHost: true})
	measure("StatsActiveWorkloads", a, err)
	sizes["ended records"] = len(h.store.Ended())
	hs, err := h.stats.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: identA.GetActorUid()})
	measure("StatsHost", hs, err)
	cutsOf("StatsHost", hs.GetAbsent())
	for token := ""; ; {
		l, err := h.stats.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{PageToken: token})
		measure("ListEndedActivations", l, err)
		sizes["pages"]++
		sizes["records reached"] += len(l.GetEnded())
		if token = l.GetNextPageToken(); token == "" {
			break
		}
	}
	return sizes, cuts
}

// TestWorstCaseResponseSizes measures every response type at the worst case
// the edges allow, a full read of a hostile guest and a partial one: every
// answer is under 64 KiB, a sample under its 24 KiB cap, each cut named,
// and the ended activations' pages reach every record.
func TestWorstCaseResponseSizes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 130 activations of a 25-container fake agent")
	}
	for _, tc := range []struct {
		name    string
		partial bool
	}{{"full read", false}, {"partial read", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sizes, cuts := worstSizes(t, tc.partial)
			for _, k := range []string{"one sample", "StatsWorkload", "StatsWorkload, no host", "StatsActiveWorkloads", "StatsHost", "ListEndedActivations", "CheckpointWorkload"} {
				t.Logf("%-22s %10d bytes", k, sizes[k])
				if sizes[k] >= maxResponseBytes {
					t.Errorf("%s: %d bytes, not under %d", k, sizes[k], maxResponseBytes)
				}
			}
			if sizes["one sample"] > maxSampleBytes {
				t.Errorf("one sample: %d bytes, over its cap of %d", sizes["one sample"], maxSampleBytes)
			}
			t.Logf("%d ended records kept, %d reached in %d pages", sizes["ended records"], sizes["records reached"], sizes["pages"])
			if sizes["records reached"] != sizes["ended records"] {
				t.Errorf("pages reached %d records of %d", sizes["records reached"], sizes["ended records"])
			}
			for k, fields := range cuts {
				t.Logf("%s cut: %s", k, strings.Join(fields, ", "))
			}
			wantHost := []string{"host.kvm.qmp.counters", "host.kvm.qmp.counters", "host.vmm_threads.threads"}
			if diff := cmp.Diff(wantHost, cuts["StatsHost"]); diff != "" {
				t.Errorf("StatsHost cuts (-want +got):\n%s", diff)
			}
			// Text goes first (it carries no number), the interfaces the node
			// agent accounts apart are kept longest, and the host view itself
			// is no longer reached.
			wantSample := []string{"text", "network.interfaces", "block_io.devices", "host.kvm.qmp.counters", "host.kvm.qmp.counters",
				"host.vmm_threads.threads", "host.runner_kernel.per_cpu"}
			if tc.partial { // a partial sample carries no network or block IO
				wantSample = append(wantSample[:1:1], wantSample[3:]...)
			}
			if diff := cmp.Diff(wantSample, cuts["StatsWorkload"]); diff != "" {
				t.Errorf("StatsWorkload cuts (-want +got):\n%s", diff)
			}
			if len(cuts["the last ended record's final"]) == 0 {
				t.Error("no ended record's final names a cut")
			}
		})
	}
}

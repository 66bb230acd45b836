package microvm

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// Three guest cgroups of different figures: a user-mode loop, a
// kernel-heavy container (mostly system time), and an idle sidecar.
var (
	busy = kataagentfake.Container{UsageBytes: 300 * mib, MaxUsageBytes: 350 * mib, InactiveFileBytes: 100 * mib,
		CPUTotal: 2_500_000_000, CPUUser: 2_400_000_000, CPUSystem: 100_000_000, Pids: 7}
	kernelHeavy = kataagentfake.Container{UsageBytes: 50 * mib, MaxUsageBytes: 60 * mib, InactiveFileBytes: 10 * mib,
		CPUTotal: 500_000_000, CPUUser: 100_000_000, CPUSystem: 400_000_000, Pids: 3}
	idle = kataagentfake.Container{UsageBytes: 8 * mib, MaxUsageBytes: 9 * mib, InactiveFileBytes: 1 * mib,
		CPUTotal: 7_000_000, CPUUser: 4_000_000, CPUSystem: 3_000_000, Pids: 1}
)

// TestSampleContainersOnTheirOwn: through the real handshake, ttrpc and
// conversion, each container's CPU (total, user, system), memory, working
// set and pids are its own guest cgroup's, the sums stay as before, and a
// figure the guest does not offer is absent with its reason, not 0.
func TestSampleContainersOnTheirOwn(t *testing.T) {
	own := func(id string, cpu, user, system, mem, ws, pids uint64) source.Container {
		return source.Container{ID: id, CPUUsageUsec: ptr(cpu), CPUUserUsec: ptr(user), CPUSystemUsec: ptr(system),
			MemoryCurrentBytes: ptr(mem), MemoryWorkingSetBytes: ptr(ws), MemoryIsOwn: true, PidsCurrent: ptr(pids)}
	}
	noPids := idle
	noPids.NoPids = true
	for _, tc := range []struct {
		name    string
		opts    []kataagentfake.Option
		ids     []string
		want    []source.Container
		wantCPU uint64 // the sample's sum, as before
	}{
		{
			name: "three v2 containers, agent 4.1.0 (ns on the wire)",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("busy", kataagentfake.V2(busy)),
				kataagentfake.WithContainer("kernel", kataagentfake.V2(kernelHeavy)), kataagentfake.WithContainer("idle", kataagentfake.V2(idle))},
			ids: []string{"busy", "kernel", "idle"},
			want: []source.Container{
				own("busy", 2_500_000, 2_400_000, 100_000, 300*mib, 200*mib, 7),
				own("kernel", 500_000, 100_000, 400_000, 50*mib, 40*mib, 3),
				own("idle", 7_000, 4_000, 3_000, 8*mib, 7*mib, 1),
			},
			wantCPU: 3_007_000,
		},
		{
			name: "in the order the ref lists them",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("busy", kataagentfake.V2(busy)),
				kataagentfake.WithContainer("kernel", kataagentfake.V2(kernelHeavy)), kataagentfake.WithContainer("idle", kataagentfake.V2(idle))},
			ids: []string{"idle", "busy", "kernel"},
			want: []source.Container{
				own("idle", 7_000, 4_000, 3_000, 8*mib, 7*mib, 1),
				own("busy", 2_500_000, 2_400_000, 100_000, 300*mib, 200*mib, 7),
				own("kernel", 500_000, 100_000, 400_000, 50*mib, 40*mib, 3),
			},
			wantCPU: 3_007_000,
		},
		{
			name: "three v1 containers (cpuacct in ns, total_inactive_file)",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("3.2.0"), kataagentfake.WithContainer("busy", kataagentfake.V1(withTotalInactive(busy))),
				kataagentfake.WithContainer("kernel", kataagentfake.V1(withTotalInactive(kernelHeavy))), kataagentfake.WithContainer("idle", kataagentfake.V1(withTotalInactive(idle)))},
			ids: []string{"busy", "kernel", "idle"},
			want: []source.Container{
				own("busy", 2_500_000, 2_400_000, 100_000, 300*mib, 200*mib, 7),
				own("kernel", 500_000, 100_000, 400_000, 50*mib, 40*mib, 3),
				own("idle", 7_000, 4_000, 3_000, 8*mib, 7*mib, 1),
			},
			wantCPU: 3_007_000,
		},
		{
			name: "agent 3.8.0 on a v2 guest sends us: every CPU figure corrected alike",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("3.8.0"),
				kataagentfake.WithContainer("busy", kataagentfake.V2(inMicros(busy))), kataagentfake.WithContainer("kernel", kataagentfake.V2(inMicros(kernelHeavy)))},
			ids: []string{"busy", "kernel"},
			want: []source.Container{
				own("busy", 2_500_000, 2_400_000, 100_000, 300*mib, 200*mib, 7),
				own("kernel", 500_000, 100_000, 400_000, 50*mib, 40*mib, 3),
			},
			wantCPU: 3_000_000,
		},
		{
			name: "no pids controller in one guest cgroup: its pids absent, not 0",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("busy", kataagentfake.V2(busy)),
				kataagentfake.WithContainer("idle", kataagentfake.V2(noPids))},
			ids: []string{"busy", "idle"},
			want: []source.Container{
				own("busy", 2_500_000, 2_400_000, 100_000, 300*mib, 200*mib, 7),
				{ID: "idle", CPUUsageUsec: ptr[uint64](7_000), CPUUserUsec: ptr[uint64](4_000), CPUSystemUsec: ptr[uint64](3_000),
					MemoryCurrentBytes: ptr[uint64](8 * mib), MemoryWorkingSetBytes: ptr[uint64](7 * mib), MemoryIsOwn: true,
					Absent: []source.Absent{{Field: "pids_current", Reason: "no pids_stats in the reply (no pids controller in the guest cgroup)"}}},
			},
			wantCPU: 2_507_000,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := kataagentfake.New(t, t.TempDir(), tc.opts...)
			got := sample(t, mustOpen(t, agent.Address(), testConfig(), tc.ids...))
			if diff := cmp.Diff(tc.want, got.Containers); diff != "" {
				t.Errorf("containers (-want +got):\n%s", diff)
			}
			if got.CPUUsageUsec == nil || *got.CPUUsageUsec != tc.wantCPU {
				t.Errorf("the sample's CPU = %v, want the sum %d", got.CPUUsageUsec, tc.wantCPU)
			}
			var mem uint64
			for _, c := range got.Containers {
				mem += *c.MemoryCurrentBytes
			}
			if mem != got.MemoryCurrentBytes {
				t.Errorf("the containers' memory sums to %d, the sample says %d", mem, got.MemoryCurrentBytes)
			}
		})
	}
}

// TestContainersUserSystemNotSwapped: usage_in_usermode is user and
// usage_in_kernelmode system, on either guest. Kata's own Go shim swaps
// them in its cgroup v2 conversion (setCPUStatsV2 in
// src/runtime/pkg/containerd-shim-v2/metrics.go: UserUsec from
// UsageInKernelmode, SystemUsec from UsageInUsermode, since 3.1.0); a
// container that spends 96% of its time in user mode reads so here.
func TestContainersUserSystemNotSwapped(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
	}{
		{"v2 guest", kataagentfake.V2(busy)},
		{"v1 guest", kataagentfake.V1(withTotalInactive(busy))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply := tc.reply
			st, err := convertContainer("busy", reply, agent410)
			if err != nil {
				t.Fatal(err)
			}
			c := st.own("busy")
			if *c.CPUUserUsec != busy.CPUUser/1000 || *c.CPUSystemUsec != busy.CPUSystem/1000 {
				t.Fatalf("user %d us, system %d us; want user %d (usage_in_usermode), system %d (usage_in_kernelmode)",
					*c.CPUUserUsec, *c.CPUSystemUsec, busy.CPUUser/1000, busy.CPUSystem/1000)
			}
			// What the shim's mapping would give: caught above.
			if swappedUser := reply.GetCgroupStats().GetCpuStats().GetCpuUsage().GetUsageInKernelmode() / 1000; swappedUser == *c.CPUUserUsec {
				t.Fatalf("user %d us equals the kernel-mode figure: swapped", swappedUser)
			}
		})
	}
}

// TestContainersPartialRead: a container the agent cannot read is in
// UnreadContainers, not in Containers; the ones read keep their own
// figures (each is whole), while the sums' counters are absent as before.
func TestContainersPartialRead(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithVersion("4.1.0"),
		kataagentfake.WithContainer("busy", kataagentfake.V2(busy)), kataagentfake.WithContainer("idle", kataagentfake.V2(idle)))
	got := sample(t, mustOpen(t, agent.Address(), testConfig(), "busy", "gone", "idle"))
	var ids []string
	for _, c := range got.Containers {
		ids = append(ids, c.ID)
		if c.CPUUsageUsec == nil || c.MemoryCurrentBytes == nil {
			t.Errorf("container %s lost its own figures in a partial sample: %+v", c.ID, c)
		}
	}
	if diff := cmp.Diff([]string{"busy", "idle"}, ids); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if len(got.UnreadContainers) != 1 || got.UnreadContainers[0].ID != "gone" {
		t.Errorf("unread = %+v, want gone", got.UnreadContainers)
	}
	if got.CPUUsageUsec != nil {
		t.Errorf("a partial sum's CPU = %d, want absent", *got.CPUUsageUsec)
	}
}

// TestContainersCPUUnknown: an agent whose CPU unit cannot be told leaves
// each container's CPU figures absent with the reason, its memory kept.
func TestContainersCPUUnknown(t *testing.T) {
	st, err := convertContainer("busy", kataagentfake.V2(busy), agentDev)
	if err != nil {
		t.Fatal(err)
	}
	c := st.own("busy")
	if c.CPUUsageUsec != nil || c.CPUUserUsec != nil || c.CPUSystemUsec != nil {
		t.Fatalf("CPU figures %v %v %v, want absent", c.CPUUsageUsec, c.CPUUserUsec, c.CPUSystemUsec)
	}
	var fields []string
	for _, a := range c.Absent {
		if a.Reason != st.CPUUnknownBecause || a.Reason == "" {
			t.Errorf("absent %s: reason %q, want %q", a.Field, a.Reason, st.CPUUnknownBecause)
		}
		fields = append(fields, a.Field)
	}
	if diff := cmp.Diff([]string{"cpu_usage_usec", "cpu_user_usec", "cpu_system_usec"}, fields); diff != "" {
		t.Errorf("absent fields (-want +got):\n%s", diff)
	}
	if c.MemoryCurrentBytes == nil || *c.MemoryCurrentBytes != busy.UsageBytes || !c.MemoryIsOwn {
		t.Errorf("memory %v (own %v), want %d, own", c.MemoryCurrentBytes, c.MemoryIsOwn, busy.UsageBytes)
	}
}

// withTotalInactive is c on a v1 guest, whose hierarchical
// total_inactive_file is what the working set subtracts.
func withTotalInactive(c kataagentfake.Container) kataagentfake.Container {
	c.TotalInactiveFileBytes = c.InactiveFileBytes
	return c
}

// inMicros is c as an agent before 3.9.0 sends a v2 guest's CPU: in
// microseconds.
func inMicros(c kataagentfake.Container) kataagentfake.Container {
	c.CPUTotal, c.CPUUser, c.CPUSystem = c.CPUTotal/1000, c.CPUUser/1000, c.CPUSystem/1000
	return c
}

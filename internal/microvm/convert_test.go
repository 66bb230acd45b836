package microvm

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

var (
	agent410 = parseAgentVersion("4.1.0", "0.0.1")
	agent390 = parseAgentVersion("3.9.0", "0.0.1")
	agent382 = parseAgentVersion("3.8.2", "0.0.1")
	agentDev = parseAgentVersion("unknown", "0.0.1")
)

func TestParseAgentVersion(t *testing.T) {
	for _, tc := range []struct {
		in          string
		known       bool
		maj, mi, pa int
		beforeFix   bool
	}{
		{"4.1.0", true, 4, 1, 0, false},
		{"3.9.0", true, 3, 9, 0, false},
		{"3.8.99", true, 3, 8, 99, true},
		{"3.10.1", true, 3, 10, 1, false},
		{"2.5.2", true, 2, 5, 2, true},
		{"v3.2.0", true, 3, 2, 0, true},
		{"3.9.0-rc0", true, 3, 9, 0, false},
		{"3.8.0-alpha1+git.abc", true, 3, 8, 0, true},
		{"3.9", true, 3, 9, 0, false},
		{" 4.0.0\n", true, 4, 0, 0, false},
		{"unknown", false, 0, 0, 0, false},
		{"", false, 0, 0, 0, false},
		{"4", false, 0, 0, 0, false},
		{"1.2.3.4", false, 0, 0, 0, false},
		{"a.b.c", false, 0, 0, 0, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			v := parseAgentVersion(tc.in, "")
			if v.Known != tc.known || v.Major != tc.maj || v.Minor != tc.mi || v.Patch != tc.pa {
				t.Fatalf("parseAgentVersion(%q) = %+v", tc.in, v)
			}
			if v.Known && v.less(cpuNanosFixed) != tc.beforeFix {
				t.Fatalf("%q before 3.9.0 = %v, want %v", tc.in, v.less(cpuNanosFixed), tc.beforeFix)
			}
		})
	}
}

func TestConvertContainer(t *testing.T) {
	const (
		gib = 1 << 30
		mib = 1 << 20
	)
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
		v     agentVersion
		want  containerStats
	}{
		{
			name: "v2 guest, agent 4.1.0: ns to us, working set without inactive_file, u64::MAX is unlimited",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 300 * mib, MaxUsageBytes: 350 * mib, InactiveFileBytes: 100 * mib,
				CPUTotal: 2_500_000_000, CPUUser: 2_000_000_000, CPUSystem: 500_000_000}),
			v: agent410,
			want: containerStats{Guest: guestV2, MemoryBytes: 300 * mib, WorkingSetBytes: 200 * mib, PeakBytes: 350 * mib, PeakOffered: true,
				CPUUsec: 2_500_000, CPUUserUsec: 2_000_000, CPUSystemUsec: 500_000, CPUKnown: true},
		},
		{
			name: "v1 guest: total_inactive_file, not the cgroup-local inactive_file; 2^63 limit is unlimited",
			reply: kataagentfake.V1(kataagentfake.Container{UsageBytes: 1 * gib, MaxUsageBytes: 2 * gib, InactiveFileBytes: 10 * mib, TotalInactiveFileBytes: 400 * mib,
				CPUTotal: 7_000_000_123}),
			v: agent410,
			want: containerStats{Guest: guestV1, MemoryBytes: 1 * gib, WorkingSetBytes: 1*gib - 400*mib, PeakBytes: 2 * gib, PeakOffered: true,
				CPUUsec: 7_000_000, CPUKnown: true},
		},
		{
			name:  "v1 guest on an old agent: cpuacct was always ns",
			reply: kataagentfake.V1(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 8192, CPUTotal: 5_000_000}),
			v:     agent382,
			want:  containerStats{Guest: guestV1, MemoryBytes: 4096, WorkingSetBytes: 4096, PeakBytes: 8192, PeakOffered: true, CPUUsec: 5000, CPUKnown: true},
		},
		{
			name: "v2 guest, agent 3.8.2 sends us: no division",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 4096,
				CPUTotal: 2_500_000, CPUUser: 2_000_000, CPUSystem: 500_000}),
			v: agent382,
			want: containerStats{Guest: guestV2, MemoryBytes: 4096, WorkingSetBytes: 4096, PeakBytes: 4096, PeakOffered: true, CPUUsec: 2_500_000,
				CPUUserUsec: 2_000_000, CPUSystemUsec: 500_000, CPUKnown: true, CPUFromMicros: true},
		},
		{
			name:  "v2 guest, agent 3.9.0 already sends ns",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 4096, CPUTotal: 2_500_000_000}),
			v:     agent390,
			want:  containerStats{Guest: guestV2, MemoryBytes: 4096, WorkingSetBytes: 4096, PeakBytes: 4096, PeakOffered: true, CPUUsec: 2_500_000, CPUKnown: true},
		},
		{
			name:  "v2 guest, agent version unknown: CPU unit unverified",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 4096, CPUTotal: 2_500_000_000}),
			v:     agentDev,
			want: containerStats{Guest: guestV2, MemoryBytes: 4096, WorkingSetBytes: 4096, PeakBytes: 4096, PeakOffered: true,
				CPUUnknownBecause: `agent version "unknown" is not a release number, so the CPU unit of this cgroup v2 guest (us before agent 3.9.0, ns after) is unverified`},
		},
		{
			name:  "missing inactive_file: working set is usage",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 300 * mib, MaxUsageBytes: 300 * mib, OmitInactiveFile: true, CPUTotal: 1000}),
			v:     agent410,
			want:  containerStats{Guest: guestV2, MemoryBytes: 300 * mib, WorkingSetBytes: 300 * mib, PeakBytes: 300 * mib, PeakOffered: true, CPUUsec: 1, CPUKnown: true},
		},
		{
			name:  "inactive_file above usage: working set floored at 0",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 100, MaxUsageBytes: 100, InactiveFileBytes: 4096}),
			v:     agent410,
			want:  containerStats{Guest: guestV2, MemoryBytes: 100, PeakBytes: 100, PeakOffered: true, CPUKnown: true},
		},
		{
			name:  "v2 kernel before 5.19: no memory.peak",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096}),
			v:     agent410,
			want:  containerStats{Guest: guestV2, MemoryBytes: 4096, WorkingSetBytes: 4096, CPUKnown: true},
		},
		{
			name:  "v1 peak reset below usage: the peak is at least usage",
			reply: kataagentfake.V1(kataagentfake.Container{UsageBytes: 8192, MaxUsageBytes: 4096}),
			v:     agent410,
			want:  containerStats{Guest: guestV1, MemoryBytes: 8192, WorkingSetBytes: 8192, PeakBytes: 8192, PeakOffered: true, CPUKnown: true},
		},
		{
			name:  "a real limit",
			reply: kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 4096, LimitBytes: 512 * mib}),
			v:     agent410,
			want:  containerStats{Guest: guestV2, MemoryBytes: 4096, WorkingSetBytes: 4096, PeakBytes: 4096, PeakOffered: true, CPUKnown: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := convertContainer("a", tc.reply, tc.v)
			if err != nil {
				t.Fatal(err)
			}
			// The signals (limits among them) have their own table:
			// TestConvertSignals.
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(containerStats{}, "Signals")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestConvertContainerMalformed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
		token string
	}{
		{"empty reply", &katagrpc.StatsContainerResponse{}, "cgroup_stats"},
		{"no cpu", &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{MemoryStats: &katagrpc.MemoryStats{Usage: &katagrpc.MemoryData{}}}}, "cpu_usage"},
		{"no memory", &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{CpuStats: &katagrpc.CpuStats{CpuUsage: &katagrpc.CpuUsage{}}}}, "memory_stats.usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := convertContainer("ctr-1", tc.reply, agent410)
			if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), tc.token) || !strings.Contains(err.Error(), "ctr-1") {
				t.Fatalf("err = %v; want ErrMalformed naming ctr-1 and %q", err, tc.token)
			}
		})
	}
}

func TestDetectGuest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *katagrpc.StatsContainerResponse
		want  guestCgroup
	}{
		{"v1", kataagentfake.V1(kataagentfake.Container{}), guestV1},
		{"v2", kataagentfake.V2(kataagentfake.Container{}), guestV2},
		{"v1 without inactive keys still has total_rss", kataagentfake.V1(kataagentfake.Container{OmitInactiveFile: true}), guestV1},
		{"empty stats", &katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{MemoryStats: &katagrpc.MemoryStats{}}}, guestUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := tc.reply.GetCgroupStats()
			if got := detectGuest(cg.GetMemoryStats(), cg.GetCpuStats().GetCpuUsage()); got != tc.want {
				t.Fatalf("detectGuest = %v, want %v", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func ok(id string, reply *katagrpc.StatsContainerResponse, v agentVersion) containerResult {
	s, err := convertContainer(id, reply, v)
	if err != nil {
		panic(err)
	}
	return containerResult{ID: id, Stats: s}
}

func TestAggregate(t *testing.T) {
	const addr = "hvsock:///run/vc/vm/x/clh.sock:1024"
	const mib = 1 << 20
	a := kataagentfake.V2(kataagentfake.Container{UsageBytes: 300 * mib, MaxUsageBytes: 350 * mib, InactiveFileBytes: 100 * mib, CPUTotal: 2_500_000_000})
	b := kataagentfake.V2(kataagentfake.Container{UsageBytes: 50 * mib, MaxUsageBytes: 60 * mib, InactiveFileBytes: 70 * mib, CPUTotal: 500_000_000})
	huge := kataagentfake.V2(kataagentfake.Container{UsageBytes: math.MaxUint64 - 10, MaxUsageBytes: math.MaxUint64 - 10, CPUTotal: math.MaxUint64})
	unknown := containerResult{ID: "ghost", Err: errUnknownContainer, Why: "unknown container"}

	for _, tc := range []struct {
		name    string
		v       agentVersion
		results []containerResult
		want    source.Reading
	}{
		{
			name:    "two v2 containers summed",
			v:       agent410,
			results: []containerResult{ok("a", a, agent410), ok("b", b, agent410)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "4.1.0"; guest cgroup v2; 2 container(s) summed; memory peak is the sum of per-container peaks, an upper bound on the workload's peak; memory limit: unlimited`,
				MemoryCurrentBytes:    350 * mib,
				MemoryPeakBytes:       ptr[uint64](410 * mib),
				MemoryWorkingSetBytes: 200 * mib, // 200 + max(50-70, 0)
				CPUUsageUsec:          cpuUsec(3_000_000),
			},
		},
		{
			name:    "saturating sums",
			v:       agent410,
			results: []containerResult{ok("a", a, agent410), ok("huge", huge, agent410)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "4.1.0"; guest cgroup v2; 2 container(s) summed; memory peak is the sum of per-container peaks, an upper bound on the workload's peak; memory limit: unlimited`,
				MemoryCurrentBytes:    math.MaxUint64,
				MemoryPeakBytes:       ptr[uint64](math.MaxUint64),
				MemoryWorkingSetBytes: math.MaxUint64,
				CPUUsageUsec:          cpuUsec(2_500_000 + math.MaxUint64/1000),
			},
		},
		{
			name:    "old agent on a v2 guest: corrected, and said so",
			v:       agent382,
			results: []containerResult{ok("a", kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, MaxUsageBytes: 4096, CPUTotal: 2_500_000}), agent382)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "3.8.2"; guest cgroup v2; 1 container(s) summed; CPU corrected from us (agent < 3.9.0 on a cgroup v2 guest); memory limit: unlimited`,
				MemoryCurrentBytes:    4096,
				MemoryPeakBytes:       ptr[uint64](4096),
				MemoryWorkingSetBytes: 4096,
				CPUUsageUsec:          cpuUsec(2_500_000),
			},
		},
		{
			name:    "no memory.peak in the guest: peak absent, not zero",
			v:       agent410,
			results: []containerResult{ok("a", a, agent410), ok("b", kataagentfake.V2(kataagentfake.Container{UsageBytes: 4096, LimitBytes: 1 << 30}), agent410)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "4.1.0"; guest cgroup v2; 2 container(s) summed; memory limit: unlimited`,
				MemoryCurrentBytes:    300*mib + 4096,
				MemoryWorkingSetBytes: 200*mib + 4096,
				CPUUsageUsec:          cpuUsec(2_500_000),
				Absent:                []source.Absent{{Field: "memory_peak_bytes", Reason: "the guest reports no memory peak for container(s) b (cgroup v2 memory.peak needs guest Linux 5.19)"}},
			},
		},
		{
			name:    "agent version unknown on a v2 guest: CPU absent",
			v:       agentDev,
			results: []containerResult{ok("a", a, agentDev)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "unknown"; guest cgroup v2; 1 container(s) summed; memory limit: unlimited`,
				MemoryCurrentBytes:    300 * mib,
				MemoryPeakBytes:       ptr[uint64](350 * mib),
				MemoryWorkingSetBytes: 200 * mib,
				Absent: []source.Absent{{Field: "cpu_usage_usec",
					Reason: `container(s) a: agent version "unknown" is not a release number, so the CPU unit of this cgroup v2 guest (us before agent 3.9.0, ns after) is unverified`}},
			},
		},
		{
			name:    "partial: memory of the read containers, counters and peak absent",
			v:       agent410,
			results: []containerResult{ok("a", a, agent410), unknown, ok("b", b, agent410)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "4.1.0"; guest cgroup v2; 2 container(s) summed; memory limit: unlimited`,
				MemoryCurrentBytes:    350 * mib,
				MemoryWorkingSetBytes: 200 * mib,
				UnreadContainers:      []source.ContainerError{{ID: "ghost", Reason: "unknown container"}},
				Absent: []source.Absent{
					{Field: "memory_peak_bytes", Reason: "partial sample: 1 of 3 containers unread; a partial sum is not comparable with a full one"},
					{Field: "cpu_usage_usec", Reason: "partial sample: 1 of 3 containers unread; a partial sum is not comparable with a full one"},
				},
			},
		},
		{
			name:    "v1 limits summed",
			v:       agent410,
			results: []containerResult{ok("a", kataagentfake.V1(kataagentfake.Container{UsageBytes: 1, MaxUsageBytes: 1, LimitBytes: 100}), agent410), ok("b", kataagentfake.V1(kataagentfake.Container{UsageBytes: 1, MaxUsageBytes: 1, LimitBytes: 200}), agent410)},
			want: source.Reading{
				Kind:                  source.KindGuestAgent,
				Detail:                `guest agent ` + addr + `, agent_version "4.1.0"; guest cgroup v1; 2 container(s) summed; memory peak is the sum of per-container peaks, an upper bound on the workload's peak; memory limit: 300 bytes`,
				MemoryCurrentBytes:    2,
				MemoryPeakBytes:       ptr[uint64](2),
				MemoryWorkingSetBytes: 2,
				CPUUsageUsec:          cpuUsec(0),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := aggregate(addr, tc.v, tc.results)
			if err != nil {
				t.Fatal(err)
			}
			// The signals have their own table: TestAggregateSignals.
			if diff := cmp.Diff(tc.want, withoutSignals(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAggregateAllFailed(t *testing.T) {
	timeout := containerResult{ID: "a", Err: source.ErrTimeout, Why: "timed out"}
	gone := containerResult{ID: "b", Err: source.ErrNotMeasurable, Why: "unknown container"}
	bad := containerResult{ID: "c", Err: source.ErrMalformed, Why: "malformed"}
	for _, tc := range []struct {
		name    string
		results []containerResult
		want    error
	}{
		{"all timed out", []containerResult{timeout, timeout}, source.ErrTimeout},
		{"unknown ids", []containerResult{gone}, source.ErrNotMeasurable},
		{"timeout and unknown", []containerResult{timeout, gone}, source.ErrNotMeasurable},
		{"one malformed", []containerResult{timeout, bad, gone}, source.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := aggregate("vsock://3:1024", agent410, tc.results)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "vsock://3:1024") {
				t.Fatalf("err = %v; want %v naming the agent", err, tc.want)
			}
			for _, other := range []error{source.ErrTimeout, source.ErrNotMeasurable, source.ErrMalformed} {
				if other != tc.want && errors.Is(err, other) {
					t.Fatalf("err = %v also matches %v", err, other)
				}
			}
		})
	}
}

func protoSize(m *katagrpc.StatsContainerResponse) int { return proto.Size(m) }

// cpuUsec returns a CPU counter value for a source.Reading.
func cpuUsec(v uint64) *uint64 { return &v }

// signalParts are the Reading parts (and their absent field prefixes) that
// convert_signals.go fills.
var signalParts = []string{"memory_signals", "cpu_throttling", "pressure", "pids", "network", "block_io"}

// isSignalField reports whether an absent field belongs to a signal part.
func isSignalField(field string) bool {
	part, _, _ := strings.Cut(field, ".")
	return slices.Contains(signalParts, part)
}

// withoutSignals is r without its signals and traffic parts and their
// absent entries: what the memory and CPU tests compare.
func withoutSignals(r source.Reading) source.Reading {
	// The per-container figures have their own tables too
	// (TestSampleContainersOnTheirOwn, TestContainersUserSystemNotSwapped).
	r.Containers = nil
	r.Memory, r.Throttling, r.Pressure, r.Pids, r.Network, r.BlockIO = nil, nil, nil, nil, nil, nil
	var kept []source.Absent
	for _, a := range r.Absent {
		if !isSignalField(a.Field) {
			kept = append(kept, a)
		}
	}
	r.Absent = kept
	return r
}

package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The golden files show each output once, end to end. These tests cover the
// cells a golden run does not reach: absent and unmeasured values, and the
// outcomes a real daemon is hard to put in.

func TestPollTableCells(t *testing.T) {
	noPeak := &sandboxstatsv1.WorkloadStatsSample{
		ActorUid: "actor-2", SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
		Source: sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT, MemoryCurrentBytes: 20 << 20, CpuUsageUsec: proto.Uint64(250_000),
	}
	unmeasured := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "actor-3", SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		MemoryCurrentBytes: 1 << 30, CpuUsageUsec: proto.Uint64(7)}
	for _, tc := range []struct {
		name string
		r    sweep.DaemonResult
		want string // the row, columns separated by single spaces
	}{
		{"no peak", sweep.DaemonResult{Socket: "b", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{noPeak}},
			"b ok actor-2 microvm guest-agent - - 0.250 20.0 0.0 - -"},
		{"not measured", sweep.DaemonResult{Socket: "c", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{unmeasured}},
			"c ok actor-3 gvisor unspecified - - - - - - not measured"},
		{"no workload, no detail", sweep.DaemonResult{Socket: "d", Status: sweep.StatusNoSample, NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD},
			"d no-sample - - - - - - - - - no-workload"},
		{"hung", sweep.DaemonResult{Socket: "f", Status: sweep.StatusError, Code: codes.DeadlineExceeded,
			Err: wrap(status.Error(codes.DeadlineExceeded, "context deadline exceeded"))},
			"f error:DeadlineExceeded - - - - - - - - - context deadline exceeded"},
		{"vanished", sweep.DaemonResult{Socket: "g", Status: sweep.StatusVanished, Code: codes.Unavailable,
			Err: wrap(status.Error(codes.Unavailable, "connection error"))},
			"g vanished - - - - - - - - - connection error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writePollTable(&b, []sweep.DaemonResult{tc.r}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("want a header and one row, got:\n%s", b.String())
			}
			if diff := cmp.Diff(tc.want, strings.Join(strings.Fields(lines[1]), " ")); diff != "" {
				t.Errorf("row (-want +got):\n%s", diff)
			}
		})
	}
}

// wrap wraps err as the sweep does (its message names the socket).
func wrap(err error) error { return fmt.Errorf("sweep: poll /run/statsd/x.sock: %w", err) }

func TestWatchTableCells(t *testing.T) {
	at := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC).UnixNano()
	measured := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "a1", Source: sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		MemoryCurrentBytes: 100 << 20, MemoryWorkingSetBytes: 80 << 20, CpuUsageUsec: proto.Uint64(1), ObservedAtUnixNano: at}
	unmeasured := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "a1", MemoryCurrentBytes: 1 << 30, ObservedAtUnixNano: at + 2e9}
	same := proto.Clone(measured).(*sandboxstatsv1.WorkloadStatsSample)
	var w rate.Watcher
	var b bytes.Buffer
	rows := newTableWriter(&b)
	for _, s := range []*sandboxstatsv1.WorkloadStatsSample{measured, unmeasured, same} {
		if err := rows.WriteRow(w.Observe(s)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")[1:] {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"2026-11-29T17:00:00.000Z a1 cgroup - 100.0 80.0 - first-sight", // no peak offered
		"2026-11-29T17:00:02.000Z a1 unspecified - - - - not-measured",  // nothing shown, not zeros
		"2026-11-29T17:00:00.000Z a1 cgroup - 100.0 80.0 - no-interval",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestHostSampleCells(t *testing.T) {
	hs := &sandboxstatsv1.HostStats{
		GuestName: "srv1", GuestNameSource: "pid file directory",
		RunnerKernel: &sandboxstatsv1.RunnerKernelView{Error: "/proc/stat: timed out"},
		VmmThreads: &sandboxstatsv1.VmmThreadsView{
			ProcessSource: "vmm_pid", Pids: []int32{42}, UserHz: 100,
			Threads: []*sandboxstatsv1.VmmThread{
				{Pid: 42, Tid: 43, Name: "CPU 1/KVM", Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU, VcpuIndex: proto.Int32(1), StartTimeTicks: 7, UtimeUsec: 10, StimeUsec: 20},
			},
			VcpuTotals:   &sandboxstatsv1.VmmThreadTotals{Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU, Threads: 1, UtimeUsec: 10, StimeUsec: 20},
			ReusedTids:   []int32{43},
			ThreadErrors: []string{"43: schedstat absent"},
		},
		Kvm: &sandboxstatsv1.KvmView{
			Debugfs: &sandboxstatsv1.KvmSourceView{Source: sandboxstatsv1.KvmSource_KVM_SOURCE_DEBUGFS, State: sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL,
				Origin: "kvm/42-11", Reason: "one file unreadable", Absent: []string{"halt_exits"},
				Counters: []*sandboxstatsv1.KvmCounter{{Scope: "vm", Name: "largepages", Kind: sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_GAUGE, Value: 3, Unit: "count"}}},
			Qmp: &sandboxstatsv1.KvmSourceView{Source: sandboxstatsv1.KvmSource_KVM_SOURCE_QMP, State: sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED},
		},
	}
	var b bytes.Buffer
	if err := writeHostSample(&b, hs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	for _, want := range []string{
		"unavailable: /proc/stat: timed out",
		"processes: vmm_pid, pids [42], USER_HZ 100",
		"42 43 CPU 1/KVM vcpu1 7 10 20 0 absent absent absent", // no schedstat: absent, not 0
		"vcpu 1 10 20 0 - -",
		"finding: tid 43 was reused since the previous sample (new start time): its counters restarted",
		"thread shortfall: 43: schedstat absent",
		"-- debugfs: partial (kvm/42-11) --",
		"reason: one file unreadable",
		"vm largepages gauge 3 count",
		"absent: halt_exits",
		"-- qmp: not configured --",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("no line %q in:\n%s", want, b.String())
		}
	}
}

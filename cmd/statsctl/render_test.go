package main

import (
	"bytes"
	"fmt"
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

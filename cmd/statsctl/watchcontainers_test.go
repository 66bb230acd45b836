package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// podWatch is a gVisor pod's samples every 5 s as statsd gives them
// (hand-made: the sentry source's shape): app burns half a core, the
// sidecar little; app exits and is restarted under a new id; the sidecar
// exits; the own share grows beside. CPU in ms.
func podWatch() []*sandboxstatsv1.WorkloadStatsSample {
	t0 := time.Date(2026, 11, 29, 12, 1, 30, 0, time.UTC)
	type c struct {
		id, name string
		ms       uint64
		exited   bool
	}
	mk := func(sec int, ownMs uint64, cs ...c) *sandboxstatsv1.WorkloadStatsSample {
		s := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "actor-7f3c", SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
			Source: sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP, EpochUnixNano: t0.Add(-time.Minute).UnixNano(),
			ObservedAtUnixNano: t0.Add(time.Duration(sec) * time.Second).UnixNano(),
			MemoryCurrentBytes: 212 << 20, MemoryWorkingSetBytes: 200 << 20, SandboxOwnCpuUsec: proto.Uint64(ownMs * 1000)}
		sum := ownMs * 1000
		for _, x := range cs {
			ct := &sandboxstatsv1.ContainerStats{Id: x.id, Name: x.name, CpuUsageUsec: proto.Uint64(x.ms * 1000), Exited: x.exited}
			if !x.exited {
				ct.PidsCurrent = proto.Uint64(3)
			}
			s.Containers = append(s.Containers, ct)
			sum += x.ms * 1000
		}
		s.CpuUsageUsec = proto.Uint64(sum)
		return s
	}
	app := "4c1e0f5a9d7b3e2f1a0c9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"
	return []*sandboxstatsv1.WorkloadStatsSample{
		mk(0, 200, c{app, "app", 10_000, false}, c{"9b27aa", "sidecar", 400, false}),
		mk(5, 450, c{app, "app", 12_500, false}, c{"9b27aa", "sidecar", 450, false}),
		mk(10, 700, c{app, "app", 13_000, true}, c{"9b27aa", "sidecar", 500, false}, c{"d00d01", "app", 1_500, false}),
		mk(15, 950, c{app, "app", 13_000, true}, c{"9b27aa", "sidecar", 520, true}, c{"d00d01", "app", 4_000, false}),
	}
}

// TestGoldenWatchContainers: under each watch row its containers, each
// with its CPU cores over the row's interval (none at first sight, none
// for one new since the previous sample), exited ones marked, and the
// sandbox's own share; the same in JSON.
func TestGoldenWatchContainers(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    func(*bytes.Buffer) rowWriter
	}{
		{"watch-containers-table", func(b *bytes.Buffer) rowWriter { return newTableWriter(b) }},
		{"watch-containers-json", func(b *bytes.Buffer) rowWriter { return newJSONWriter(b) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			rows, w := tc.w(&b), &rate.Watcher{}
			for _, s := range podWatch() {
				if err := rows.WriteRow(w.Observe(s)); err != nil {
					t.Fatal(err)
				}
			}
			golden(t, tc.name, b.String())
		})
	}
}

// TestGoldenStatsExited: stats marks an exited container (its CPU its
// last, its gauges absent) and prints the sandbox's own share.
func TestGoldenStatsExited(t *testing.T) {
	s := podWatch()[3]
	s.Containers[0].Absent = []*sandboxstatsv1.AbsentValue{{Field: "pids_current", Reason: "exited"}}
	s.Containers[1].Absent = s.Containers[0].Absent
	var b bytes.Buffer
	if err := writeSampleTable(&b, s); err != nil {
		t.Fatal(err)
	}
	golden(t, "stats-containers-exited", b.String())
}

// TestWatchContainerNamesSafe: a container's name and id reach the
// terminal through safe (an escape in a guest's name is printed, not
// acted on).
func TestWatchContainerNamesSafe(t *testing.T) {
	s := podWatch()[0]
	s.Containers[0].Name, s.Containers[0].Id = "app\x1b]0;owned\x07", "\x1b[2J"
	var b bytes.Buffer
	if err := newTableWriter(&b).WriteRow((&rate.Watcher{}).Observe(s)); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(b.String(), '\x1b') {
		t.Errorf("an escape reached the table:\n%q", b.String())
	}
}

package main

import (
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestGoldenContainerSets: run-workload names containers (--container
// id=name), update-containers replaces the set with the epoch kept, a
// refused set says why, and stats marks a container that left the sandbox
// exited (STATE column) with its CPU as last read.
func TestGoldenContainerSets(t *testing.T) {
	d := startDaemon(t)
	u := func(v uint64) *uint64 { return &v }
	const noSplit = "the sentry accounts a container's CPU as one figure"
	absent := []source.Absent{{Field: "cpu_user_usec", Reason: noSplit}, {Field: "cpu_system_usec", Reason: noSplit}}
	reading := func(cs ...source.Container) source.Reading {
		return source.Reading{Kind: source.KindCgroup, Detail: "cgroup v2: /sys/fs/cgroup/statstest/pod1",
			MemoryCurrentBytes: 222_867_456, MemoryPeakBytes: &peak, MemoryWorkingSetBytes: 222_728_192,
			CPUUsageUsec: u(950_000), SandboxProcesses: &procs, Containers: cs}
	}
	both := reading(
		source.Container{ID: "4c1e0f", Name: "annotated", CPUUsageUsec: u(655_000), Absent: absent},
		source.Container{ID: "9b27aa", CPUUsageUsec: u(39_000), Absent: absent})
	onlyApp := reading(source.Container{ID: "4c1e0f", Name: "annotated", CPUUsageUsec: u(700_000), Absent: absent})
	runGolden(t, d, []goldenCase{
		{name: "run-workload-containers", args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c",
			"--cgroup-path", "/statstest/pod1", "--container", "4c1e0f=app", "--container", "9b27aa=sidecar"}},
		{name: "stats-containers-named", reading: both, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "stats-containers-exit-kept", reading: onlyApp, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "update-containers", reading: onlyApp, args: []string{"update-containers", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c",
			"--container", "4c1e0f=web"}},
		{name: "stats-containers-renamed", reading: onlyApp, args: []string{"stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c"}},
		{name: "update-containers-twice", args: []string{"update-containers", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "actor-7f3c",
			"--container", "4c1e0f=web", "--container", "4c1e0f=app"}, code: exitError},
		{name: "update-containers-other", args: []string{"update-containers", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "nobody",
			"--container", "4c1e0f=web"}, code: exitError},
		{name: "update-containers-no-id", args: []string{"update-containers", "--actor-uid", "actor-7f3c", "--container", "=web"}, code: exitUsage},
		{name: "run-workload-containers-and-ids", args: []string{"run-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "vm-1",
			"--agent-address", "hvsock:///run/vm/clh.sock:1024", "--container-id", "web", "--container", "api=api"}, code: exitError},
	})
}

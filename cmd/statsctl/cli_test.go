package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/version"
)

// TestGoldenCLI: the rough edges of the ecosystem issue, each fixed:
// global flags before the command, the socket spellings, the class implied
// by the ref flags, the version, exit statuses in --help.
func TestGoldenCLI(t *testing.T) {
	d := startDaemon(t)
	readVersion = func() version.Info {
		return version.Info{Module: "github.com/sandboxstats/sandboxstats", Version: "v0.0.0-20261201091900-2ae3b55abcde+dirty",
			Revision: "2ae3b55abcde0123456789abcdef0123456789ab", Time: time.Date(2026, 12, 1, 9, 19, 0, 0, time.UTC), Modified: true,
			Go: "go1.26.8", Platform: "linux/amd64"}
	}
	t.Cleanup(func() { readVersion = version.Get })
	const hv = "hvsock:///run/vm/clh.sock:1024"
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{name: "global-socket-before", args: []string{"--socket", "$STATS", "health"}},
		{name: "global-socket-equals", args: []string{"--socket=$STATS", "--timeout", "5s", "active"}},
		{name: "global-and-own-socket", args: []string{"--socket", "$DIR/nobody.sock", "health", "--socket", "$STATS"}},
		{name: "global-ignored-by-command", args: []string{"--lifecycle-socket", "$LIFECYCLE", "--socket", "$STATS", "health"}},
		{name: "global-own-flag-before", args: []string{"--actor-uid", "x", "stats"}, code: exitUsage},
		{name: "global-missing-value", args: []string{"--socket"}, code: exitUsage},
		{name: "socket-unix-url", args: []string{"health", "--socket", "unix://$STATS"}},
		{name: "socket-unix-path", args: []string{"health", "--socket", "unix:$STATS"}},
		{name: "socket-tcp-rejected", args: []string{"health", "--socket", "tcp:127.0.0.1:9000"}, code: exitUsage},
		{name: "socket-vsock-rejected", args: []string{"--lifecycle-socket", "vsock://3:1024", "checkpoint-workload", "--actor-uid", "x"}, code: exitUsage},
		{name: "poll-sockets-http-rejected", args: []string{"poll", "--sockets", "http://127.0.0.1:9477/metrics"}, code: exitUsage},
		{name: "run-workload-no-class", args: []string{"run-workload", "--actor-uid", "x"}, code: exitUsage},
		{name: "run-workload-class-contradicts", args: []string{"run-workload", "--actor-uid", "x", "--class", "microvm", "--cgroup-path", "/statstest/pod1"}, code: exitUsage},
		{name: "run-workload-sentry-contradicts", args: []string{"run-workload", "--actor-uid", "x", "--class", "microvm", "--sentry-pid", "42"}, code: exitUsage},
		{name: "run-workload-agent-contradicts", args: []string{"run-workload", "--actor-uid", "x", "--class", "gvisor", "--agent-address", hv}, code: exitUsage},
		{name: "run-workload-two-classes", args: []string{"run-workload", "--actor-uid", "x", "--cgroup-path", "/statstest/pod1", "--agent-address", hv}, code: exitUsage},
		{name: "run-workload-implied-gvisor", args: []string{"--lifecycle-socket", "$LIFECYCLE", "run-workload", "--actor-uid", "actor-7f3c", "--cgroup-path", "/statstest/pod1"}},
		{name: "run-workload-implied-gvisor-stats", args: []string{"--socket", "$STATS", "active", "-o", "json"}},
		{name: "checkpoint-global-socket", args: []string{"--socket", "$STATS", "--lifecycle-socket", "$LIFECYCLE", "checkpoint-workload", "--actor-uid", "actor-7f3c"}},
		{name: "run-workload-implied-microvm", args: []string{"run-workload", "--lifecycle-socket", "unix://$LIFECYCLE", "--actor-uid", "vm-1", "--agent-address", hv, "--container-id", "web"}},
		{name: "run-workload-explicit-class-agrees", args: []string{"restore-workload", "--lifecycle-socket", "$LIFECYCLE", "--actor-uid", "vm-1", "--class", "microvm", "--agent-address", hv, "--container-id", "web"}},
		{name: "version", args: []string{"version"}},
		{name: "version-json", args: []string{"version", "-o", "json"}},
		{name: "version-flag", args: []string{"--version"}},
		{name: "help-command", args: []string{"help", "run-workload"}},
		{name: "help-stats", args: []string{"stats", "--help"}},
		{name: "help-unknown-command", args: []string{"help", "frobnicate"}, code: exitUsage},
		{name: "completion-no-shell", args: []string{"completion"}, code: exitUsage},
		{name: "completion-unknown-shell", args: []string{"completion", "tcsh"}, code: exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "$DIR", "/nonexistent")
			}
			d.src.set(v1Reading(), nil)
			out, errOut, code := d.ctl(t, args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, errOut)
			}
			golden(t, tc.name, "$ statsctl "+strings.Join(tc.args, " ")+"\n"+out+errOut)
		})
	}
}

func v1Reading() source.Reading {
	return source.Reading{Kind: source.KindCgroup, Detail: "cgroup v1 (hybrid): /sys/fs/cgroup/memory/statstest/pod1, /sys/fs/cgroup/cpuacct/statstest/pod1",
		MemoryCurrentBytes: 13 << 20, MemoryWorkingSetBytes: 12 << 20, MemoryPeakBytes: &peak, CPUUsageUsec: cpuUsec(255_682), SandboxProcesses: &procs}
}

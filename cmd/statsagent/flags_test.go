package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/cli"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestParseFlagsSockets: --sockets takes a glob, unix:GLOB or unix:///GLOB
// and rejects other schemes as a usage error naming the scheme.
func TestParseFlagsSockets(t *testing.T) {
	for _, tc := range []struct{ arg, want, errHas string }{
		{arg: "/run/statsd/*.sock", want: "/run/statsd/*.sock"},
		{arg: "unix:/run/statsd/*.sock", want: "/run/statsd/*.sock"},
		{arg: "unix:///run/statsd/*.sock", want: "/run/statsd/*.sock"},
		{arg: "tcp:127.0.0.1:9000", errHas: `scheme "tcp" is not supported`},
		{arg: "vsock:3:1024", errHas: `scheme "vsock" is not supported`},
		{arg: "http://127.0.0.1:9477", errHas: `scheme "http" is not supported`},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			o, _, err := parseFlags([]string{"--sockets", tc.arg}, io.Discard)
			if tc.errHas != "" {
				var ue cli.UsageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err %v, want a usage error containing %q", err, tc.errHas)
				}
				return
			}
			if err != nil || o.agent.Sockets != tc.want {
				t.Fatalf("sockets %q, err %v; want %q", o.agent.Sockets, err, tc.want)
			}
		})
	}
}

// TestParseFlagsUsage: --version, --help with the exit statuses, and usage
// errors (exit 2).
func TestParseFlagsUsage(t *testing.T) {
	if _, _, err := parseFlags([]string{"--version"}, io.Discard); !errors.Is(err, cli.ErrVersion) {
		t.Errorf("--version: %v, want cli.ErrVersion", err)
	}
	var help bytes.Buffer
	if _, _, err := parseFlags([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	for _, want := range []string{"Usage: statsagent [flags]", "-version", "Exit status: 0 after a clean shutdown", "2 for a usage error", "unix:///GLOB"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, help.String())
		}
	}
	for _, args := range [][]string{{"extra"}, {"--no-such-flag"}, {"--timeout", "0"}} {
		var ue cli.UsageError
		if _, _, err := parseFlags(args, io.Discard); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// TestSocketsUnixURL: an agent given --sockets unix:///DIR/*.sock polls
// the daemons there.
func TestSocketsUnixURL(t *testing.T) {
	dir := t.TempDir()
	d := statsdfake.Start(t, filepath.Join(dir, "a.sock"))
	d.Set(&sandboxstatsv1.WorkloadStatsSample{ActorUid: "a", SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source: sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP, MemoryCurrentBytes: 1 << 20, CpuUsageUsec: proto.Uint64(1)})
	base, _, _ := startAgent(t, "--sockets", "unix://"+filepath.Join(dir, "*.sock"), "--interval", "200ms", "--min-interval", "100ms", "--timeout", "100ms")
	if m := waitSweeps(t, base, 1); m["sandboxstats_agent_daemons{result=ok}"] != 1 {
		t.Errorf("daemons ok = %v, want 1", m["sandboxstats_agent_daemons{result=ok}"])
	}
}

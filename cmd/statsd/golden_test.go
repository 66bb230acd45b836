package main

import (
	"context"
	"io"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestGoldenCLI: what statsd prints and its exit status for --help and for
// usage errors, each printed once (exit 2). Only arguments statsd rejects
// before it serves belong here.
func TestGoldenCLI(t *testing.T) {
	testenv.GoldenCLI(t, "statsd", []testenv.CLICase{
		{Name: "help", Args: []string{"--help"}},
		{Name: "listen-tcp-rejected", Args: []string{"--listen", "tcp://127.0.0.1:9000"}, Code: 2},
		{Name: "lifecycle-listen-vsock-rejected", Args: []string{"--lifecycle-listen", "vsock://3:1024"}, Code: 2},
		{Name: "read-allow-gids-bad", Args: []string{"--read-allow-gids", "wheel"}, Code: 2},
		{Name: "unknown-flag", Args: []string{"--no-such-flag"}, Code: 2},
		{Name: "stray-argument", Args: []string{"serve"}, Code: 2},
	}, func(args []string, stdout, stderr io.Writer) int {
		return exitStatus(run(context.Background(), args, stderr), stdout, stderr)
	})
}

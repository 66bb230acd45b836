package main

import (
	"context"
	"io"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestGoldenCLI: what statsagent prints and its exit status for --help and for
// usage errors, each printed once (exit 2). Only arguments statsagent rejects
// before it serves belong here.
func TestGoldenCLI(t *testing.T) {
	testenv.GoldenCLI(t, "statsagent", []testenv.CLICase{
		{Name: "help", Args: []string{"--help"}},
		{Name: "sockets-http-rejected", Args: []string{"--sockets", "http://127.0.0.1:9477/metrics"}, Code: 2},
		{Name: "timeout-zero", Args: []string{"--timeout", "0"}, Code: 2},
		{Name: "unknown-flag", Args: []string{"--no-such-flag"}, Code: 2},
		{Name: "stray-argument", Args: []string{"serve"}, Code: 2},
	}, func(args []string, stdout, stderr io.Writer) int {
		return exitStatus(run(context.Background(), args, stderr), stdout, stderr)
	})
}

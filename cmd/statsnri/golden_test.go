package main

import (
	"context"
	"io"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestGoldenCLI: what statsnri prints and its exit status for --help and for
// usage errors, each printed once (exit 2).
func TestGoldenCLI(t *testing.T) {
	ok := []string{"--statsd", "/run/statsd/lifecycle/nri-0.sock,/run/statsd/nri-0.sock"}
	testenv.GoldenCLI(t, "statsnri", []testenv.CLICase{
		{Name: "help", Args: []string{"--help"}},
		{Name: "no-statsd", Args: []string{}, Code: 2},
		{Name: "statsd-one-socket", Args: []string{"--statsd", "/run/statsd/lifecycle/nri-0.sock"}, Code: 2},
		{Name: "statsd-tcp-rejected", Args: []string{"--statsd", "tcp://127.0.0.1:1,/run/statsd/nri-0.sock"}, Code: 2},
		{Name: "statsd-twice", Args: append(ok, ok...), Code: 2},
		{Name: "template-from-bad", Args: append(ok, "--template-from", "env:TEMPLATE"), Code: 2},
		{Name: "handler-glob-bad", Args: append(ok, "--handlers", "kata["), Code: 2},
		{Name: "no-handlers", Args: append(ok, "--handlers", ","), Code: 2},
		{Name: "namespace-cap-negative", Args: append(ok, "--namespace-cap", "-1"), Code: 2},
		{Name: "unknown-flag", Args: []string{"--no-such-flag"}, Code: 2},
		{Name: "stray-argument", Args: append(ok, "serve"), Code: 2},
	}, func(args []string, stdout, stderr io.Writer) int {
		return exitStatus(run(context.Background(), args, stderr), stdout, stderr)
	})
}

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestGoldenCLI: what statsagent prints and its exit status for --help and for
// usage errors, each printed once (exit 2). Only arguments statsagent rejects
// before it serves belong here.
func TestGoldenCLI(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{name: "help", args: []string{"--help"}},
		{name: "sockets-http-rejected", args: []string{"--sockets", "http://127.0.0.1:9477/metrics"}, code: 2},
		{name: "timeout-zero", args: []string{"--timeout", "0"}, code: 2},
		{name: "unknown-flag", args: []string{"--no-such-flag"}, code: 2},
		{name: "stray-argument", args: []string{"serve"}, code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := exitStatus(run(context.Background(), tc.args, &errOut), &out, &errOut)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, errOut.String())
			}
			golden(t, tc.name, "$ statsagent "+strings.Join(tc.args, " ")+"\n"+out.String()+errOut.String())
		})
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	testenv.Golden(t, name, []byte(got))
}

package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGoldenCLI: what statsd prints and its exit status for --help and for
// usage errors, each printed once (exit 2). Only arguments statsd rejects
// before it serves belong here.
func TestGoldenCLI(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{name: "help", args: []string{"--help"}},
		{name: "listen-tcp-rejected", args: []string{"--listen", "tcp://127.0.0.1:9000"}, code: 2},
		{name: "lifecycle-listen-vsock-rejected", args: []string{"--lifecycle-listen", "vsock://3:1024"}, code: 2},
		{name: "read-allow-gids-bad", args: []string{"--read-allow-gids", "wheel"}, code: 2},
		{name: "unknown-flag", args: []string{"--no-such-flag"}, code: 2},
		{name: "stray-argument", args: []string{"serve"}, code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := exitStatus(run(context.Background(), tc.args, &errOut), &out, &errOut)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, errOut.String())
			}
			golden(t, tc.name, "$ statsd "+strings.Join(tc.args, " ")+"\n"+out.String()+errOut.String())
		})
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\n--- want\n%s--- got\n%s", p, want, got)
	}
}

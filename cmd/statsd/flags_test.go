package main

import (
	"github.com/sandboxstats/sandboxstats/internal/cli"

	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParseFlagsSocketAddresses: --listen and --lifecycle-listen take a
// path, unix:PATH or unix:///PATH (what grpcurl and crictl are given) and
// reject every other scheme as a usage error naming it.
func TestParseFlagsSocketAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, listen, want, errHas string
	}{
		{name: "path", listen: "/run/statsd/sbx-1.sock", want: "/run/statsd/sbx-1.sock"},
		{name: "unix:PATH", listen: "unix:/run/statsd/sbx-1.sock", want: "/run/statsd/sbx-1.sock"},
		{name: "unix:///PATH", listen: "unix:///run/statsd/sbx-1.sock", want: "/run/statsd/sbx-1.sock"},
		{name: "tcp", listen: "tcp:127.0.0.1:9000", errHas: `scheme "tcp" is not supported`},
		{name: "vsock", listen: "vsock://3:1024", errHas: `scheme "vsock" is not supported`},
		{name: "http", listen: "http://127.0.0.1:9000", errHas: `scheme "http" is not supported`},
		{name: "unix:// with a host", listen: "unix://run/x.sock", errHas: "absolute path and no host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []string{"--listen", "--lifecycle-listen"} {
				args := []string{"--listen", "/run/a.sock", "--lifecycle-listen", "/run/lifecycle/a.sock", f, tc.listen}
				c, err := parseFlags(args, io.Discard)
				if tc.errHas != "" {
					var ue cli.UsageError
					if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.errHas) {
						t.Fatalf("%s %s: err %v, want a usage error containing %q", f, tc.listen, err, tc.errHas)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s %s: %v", f, tc.listen, err)
				}
				got := c.listen
				if f == "--lifecycle-listen" {
					got = c.lifecycleListen
				}
				if got != tc.want {
					t.Errorf("%s %s: path %q, want %q", f, tc.listen, got, tc.want)
				}
			}
		})
	}
}

// TestParseFlagsUsage: --version, --help and the usage errors (exit 2),
// with the exit statuses in --help.
func TestParseFlagsUsage(t *testing.T) {
	if _, err := parseFlags([]string{"--version"}, io.Discard); !errors.Is(err, cli.ErrVersion) {
		t.Errorf("--version: %v, want cli.ErrVersion", err)
	}
	var help bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	for _, want := range []string{"-version", "Exit status: 0 after a clean shutdown", "2 for a usage error", "unix:///PATH"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, help.String())
		}
	}
	for _, args := range [][]string{{"extra"}, {"--no-such-flag"}, {"--read-timeout", "0"}, {"--release-after", "-1s"}, {"--max-reads", "0"}, {"--listen", "/a.sock", "--lifecycle-listen", "unix:/a.sock"}} {
		var ue cli.UsageError
		if _, err := parseFlags(args, io.Discard); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// TestListenUnixURL is the rough edge: statsd --listen
// unix:///PATH used to create a directory named "unix:" in the working
// directory with the socket inside; it listens on PATH.
func TestListenUnixURL(t *testing.T) {
	dir := t.TempDir()
	cwd := t.TempDir()
	t.Chdir(cwd)
	_, stop := startStatsdIn(t, dir, io.Discard, "--listen", "unix://"+filepath.Join(dir, "url.sock"))
	if _, err := os.Stat(filepath.Join(dir, "url.sock")); err != nil {
		t.Errorf("no socket at the unix:/// path: %v", err)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("statsd created %v in its working directory", entries[0].Name())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestParseFlagsAllowedIDs: the peer lists default to who runs statsd when
// not given, and a given list replaces the default.
func TestParseFlagsAllowedIDs(t *testing.T) {
	me := uint32(os.Geteuid())
	wantRead := []uint32{0}
	if me != 0 {
		wantRead = append(wantRead, me)
	}
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.lifecycleUIDs, []uint32{me}) || !slices.Equal(c.readUIDs, wantRead) || c.readGIDsSet {
		t.Errorf("defaults: lifecycle %v, read uids %v, gids set %v; want %v, %v, false", c.lifecycleUIDs, c.readUIDs, c.readGIDsSet, []uint32{me}, wantRead)
	}
	c, err = parseFlags([]string{"--lifecycle-allow-uids", "7", "--read-allow-uids", "", "--read-allow-gids", "8,9"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.lifecycleUIDs, []uint32{7}) || len(c.readUIDs) != 0 || !slices.Equal(c.readGIDs, []uint32{8, 9}) || !c.readGIDsSet {
		t.Errorf("given: lifecycle %v, read uids %v, gids %v (set %v); want [7], [], [8 9] (set)", c.lifecycleUIDs, c.readUIDs, c.readGIDs, c.readGIDsSet)
	}
}

// TestParseFlagsRunscRoots: --runsc-root is repeatable, absolute, at most
// maxRunscRoots; none by default (no per-container breakdown).
func TestParseFlagsRunscRoots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		want   []string
		errHas string
	}{
		{name: "none", want: nil},
		{name: "containerd's runsc shim", args: []string{"--runsc-root", "/run/containerd/runsc/k8s.io"}, want: []string{"/run/containerd/runsc/k8s.io"}},
		{name: "two, cleaned", args: []string{"--runsc-root", "/var/run/runsc/", "--runsc-root", "/run/containerd/runc/k8s.io"}, want: []string{"/var/run/runsc", "/run/containerd/runc/k8s.io"}},
		{name: "relative", args: []string{"--runsc-root", "runsc"}, errHas: "not an absolute directory"},
		{name: "empty", args: []string{"--runsc-root", ""}, errHas: "not an absolute directory"},
		{name: "too many", args: slices.Repeat([]string{"--runsc-root", "/r"}, maxRunscRoots+1), errHas: "at most 8 runsc roots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseFlags(tc.args, io.Discard)
			if tc.errHas != "" {
				var ue cli.UsageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err %v, want a usage error containing %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.runscRoots, tc.want) {
				t.Errorf("runsc roots %q, want %q", c.runscRoots, tc.want)
			}
		})
	}
}

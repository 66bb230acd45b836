package sockaddr_test

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
)

var cases = []struct {
	name, addr, want string
	errHas           string // non-empty: Parse fails with this in the message
}{
	{name: "absolute path", addr: "/run/statsd/sbx-1.sock", want: "/run/statsd/sbx-1.sock"},
	{name: "relative path", addr: "stats.sock", want: "stats.sock"},
	{name: "dot-relative path with a colon", addr: "./a:b.sock", want: "./a:b.sock"},
	{name: "absolute path with a colon", addr: "/run/a:b.sock", want: "/run/a:b.sock"},
	{name: "glob", addr: "/run/statsd/*.sock", want: "/run/statsd/*.sock"},
	{name: "gRPC unix:PATH", addr: "unix:/run/x.sock", want: "/run/x.sock"},
	{name: "gRPC unix:PATH relative", addr: "unix:x.sock", want: "x.sock"},
	{name: "gRPC unix:PATH with a colon", addr: "unix:a:b.sock", want: "a:b.sock"},
	{name: "grpcurl and crictl unix:///PATH", addr: "unix:///run/x.sock", want: "/run/x.sock"},
	{name: "glob as unix:///GLOB", addr: "unix:///run/statsd/*.sock", want: "/run/statsd/*.sock"},
	{name: "scheme is case-insensitive", addr: "UNIX:///run/x.sock", want: "/run/x.sock"},
	{name: "nothing percent-decoded", addr: "unix:///run/a%20b.sock", want: "/run/a%20b.sock"},
	{name: "empty", addr: "", errHas: "empty"},
	{name: "unix: without a path", addr: "unix:", errHas: "has no path"},
	{name: "unix:// without a path", addr: "unix://", errHas: "absolute path and no host"},
	{name: "unix:// with a host", addr: "unix://run/x.sock", errHas: "absolute path and no host"},
	{name: "tcp", addr: "tcp:127.0.0.1:9000", errHas: `scheme "tcp" is not supported`},
	{name: "tcp URL", addr: "tcp://127.0.0.1:9000", errHas: `scheme "tcp" is not supported`},
	{name: "vsock", addr: "vsock:3:1024", errHas: `scheme "vsock" is not supported`},
	{name: "vsock URL", addr: "vsock://3:1024", errHas: `scheme "vsock" is not supported`},
	{name: "http", addr: "http://localhost:9477", errHas: `scheme "http" is not supported`},
	{name: "dns", addr: "dns:///statsd:9000", errHas: `scheme "dns" is not supported`},
	{name: "abstract socket", addr: "unix-abstract:statsd", errHas: `scheme "unix-abstract" is not supported`},
	{name: "hybrid vsock", addr: "hvsock:///run/vc/clh.sock:1024", errHas: `scheme "hvsock" is not supported`},
	{name: "host:port reads as a scheme", addr: "localhost:9000", errHas: `scheme "localhost" is not supported`},
	{name: "NUL byte", addr: "/run/x\x00.sock", errHas: "NUL byte"},
}

func TestParse(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sockaddr.Parse(tc.addr)
			if tc.errHas != "" {
				if err == nil || !errors.Is(err, sockaddr.ErrAddress) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("Parse(%q) = %q, %v; want an ErrAddress containing %q", tc.addr, got, err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.addr, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Parse(%q) (-want +got):\n%s", tc.addr, diff)
			}
		})
	}
}

func TestFlag(t *testing.T) {
	path := "/run/statsd/statsd.sock"
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(sockaddr.Flag{Path: &path}, "listen", "a `path`")
	if err := fs.Parse([]string{"--listen", "unix:///tmp/s.sock"}); err != nil || path != "/tmp/s.sock" {
		t.Fatalf("--listen unix:///tmp/s.sock: path %q, err %v", path, err)
	}
	err := fs.Parse([]string{"--listen", "tcp:127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), `scheme "tcp" is not supported`) || path != "/tmp/s.sock" {
		t.Fatalf("--listen tcp:...: path %q, err %v; want the scheme named and the path kept", path, err)
	}
	if got := fs.Lookup("listen").DefValue; got != "/run/statsd/statsd.sock" {
		t.Errorf("default shown as %q", got)
	}
}

func TestTarget(t *testing.T) {
	got, err := sockaddr.Target("/run/x.sock")
	if err != nil || got != "unix:///run/x.sock" {
		t.Errorf("Target(/run/x.sock) = %q, %v", got, err)
	}
	rel, err := sockaddr.Target("x.sock")
	if err != nil || !strings.HasPrefix(rel, "unix:///") || !strings.HasSuffix(rel, "/x.sock") {
		t.Errorf("Target(x.sock) = %q, %v; want an absolute unix:/// target", rel, err)
	}
}

// FuzzParse: no panic; an accepted address gives a non-empty path without a
// NUL byte, the same path again when written unix:PATH (unless PATH starts
// with //, which reads as unix://) and unix://PATH (when absolute); a plain
// path is returned unchanged; a rejected one wraps ErrAddress.
func FuzzParse(f *testing.F) {
	for _, tc := range cases {
		f.Add(tc.addr)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		p, err := sockaddr.Parse(addr)
		if err != nil {
			if !errors.Is(err, sockaddr.ErrAddress) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrAddress", addr, err)
			}
			return
		}
		if p == "" || strings.IndexByte(p, 0) >= 0 {
			t.Fatalf("Parse(%q) = %q", addr, p)
		}
		if !strings.Contains(addr, ":") && p != addr {
			t.Fatalf("plain path %q became %q", addr, p)
		}
		if !strings.HasPrefix(p, "//") {
			if again, err := sockaddr.Parse("unix:" + p); err != nil || again != p {
				t.Fatalf("Parse(unix:%s) = %q, %v; want %q", p, again, err, p)
			}
		}
		if strings.HasPrefix(p, "/") {
			if again, err := sockaddr.Parse("unix://" + p); err != nil || again != p {
				t.Fatalf("Parse(unix://%s) = %q, %v; want %q", p, again, err, p)
			}
		}
	})
}

package microvm

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want Address
	}{
		{"cloud hypervisor", "hvsock:///run/vc/vm/abc/clh.sock:1024", Address{Scheme: SchemeHybridVsock, Path: "/run/vc/vm/abc/clh.sock", Port: 1024}},
		{"firecracker jailer", "hvsock:///run/vc/firecracker/abc/root/kata.hvsock:1024", Address{Scheme: SchemeHybridVsock, Path: "/run/vc/firecracker/abc/root/kata.hvsock", Port: 1024}},
		{"colon in path", "hvsock:///tmp/a:b/x.sock:2048", Address{Scheme: SchemeHybridVsock, Path: "/tmp/a:b/x.sock", Port: 2048}},
		{"qemu", "vsock://16187:1024", Address{Scheme: SchemeVsock, CID: 16187, Port: 1024}},
		{"largest cid", "vsock://4294967294:1024", Address{Scheme: SchemeVsock, CID: 4294967294, Port: 1024}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAddress(tc.in)
			if err != nil {
				t.Fatalf("ParseAddress(%q): %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseAddress(%q) (-want +got):\n%s", tc.in, diff)
			}
			if got.String() != tc.in {
				t.Errorf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
}

func TestParseAddressRejects(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"no scheme", "/run/vc/vm/abc/clh.sock:1024"},
		{"mock scheme", "mock:///tmp/agent.sock"},
		{"unix scheme", "unix:///tmp/agent.sock:1024"},
		{"runtime-rs form without port", "hvsock:///run/kata/abc/kata.hvsock"},
		{"relative path", "hvsock://run/clh.sock:1024"},
		{"empty path", "hvsock://:1024"},
		{"port zero", "hvsock:///x.sock:0"},
		{"port any", "vsock://3:4294967295"},
		{"port too big", "vsock://3:4294967296"},
		{"signed port", "vsock://3:+1024"},
		{"port with space", "vsock://3: 1024"},
		{"hex cid", "vsock://0x10:1024"},
		{"leading zero", "vsock://03:01024"},
		{"cid of host", "vsock://2:1024"},
		{"cid local", "vsock://1:1024"},
		{"cid hypervisor", "vsock://0:1024"},
		{"cid any", "vsock://4294967295:1024"},
		{"negative cid", "vsock://-1:1024"},
		{"empty port", "vsock://3:"},
		{"nul in path", "hvsock:///a\x00b:1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseAddress(tc.in)
			if !errors.Is(err, ErrAddress) {
				t.Fatalf("ParseAddress(%q) = %+v, %v; want an error wrapping ErrAddress", tc.in, a, err)
			}
		})
	}
}

// FuzzParseAddress: no panic; an accepted address round-trips through
// String, and a vsock address never names a non-guest cid.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{
		"hvsock:///run/vc/vm/abc/clh.sock:1024", "vsock://16187:1024", "vsock://2:1024",
		"hvsock:///a:b:c:1", "hvsock://", "vsock://:", "vsock://3:99999999999", "://:",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddress(s)
		if err != nil {
			return
		}
		if a.Port == 0 || a.Port == 0xFFFFFFFF {
			t.Fatalf("%q: accepted port %d", s, a.Port)
		}
		if a.Scheme == SchemeVsock && (a.CID < 3 || a.CID == 0xFFFFFFFF) {
			t.Fatalf("%q: accepted cid %d", s, a.CID)
		}
		b, err := ParseAddress(a.String())
		if err != nil || b != a {
			t.Fatalf("%q: round trip %q = %+v, %v; want %+v", s, a.String(), b, err, a)
		}
	})
}

package gvisor

import (
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

func TestParseSingleUint(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    uint64
		wantErr string
	}{
		{in: "268435456\n", want: 268435456},
		{in: "0\n", want: 0},
		{in: "18446744073709551615\n", want: 18446744073709551615},
		{in: "max\n", wantErr: `token "max"`},
		{in: "", wantErr: "empty file"},
		{in: "\n", wantErr: "empty file"},
		{in: "-1\n", wantErr: `token "-1"`},
		{in: "12 34\n", wantErr: "want one number"},
		{in: "18446744073709551616\n", wantErr: "value out of range"},
	} {
		t.Run(strconv.Quote(tc.in), func(t *testing.T) {
			got, err := parseSingleUint([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseSingleUint(%q) = %d, %v; want error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseSingleUint(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseKeyed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in, key string
		want    uint64
		wantOK  bool
		wantErr string
	}{
		{name: "cpu.stat", in: "usage_usec 255682\nuser_usec 120000\nsystem_usec 135682\n", key: "usage_usec", want: 255682, wantOK: true},
		{name: "v2 memory.stat", in: "anon 1\ninactive_anon 2\ninactive_file 3\n", key: "inactive_file", want: 3, wantOK: true},
		{name: "key is not a prefix match", in: "inactive_file_x 9\ninactive_file 3\n", key: "inactive_file", want: 3, wantOK: true},
		{name: "v1 total_ key", in: "inactive_file 1\ntotal_inactive_file 7\n", key: "total_inactive_file", want: 7, wantOK: true},
		{name: "key absent", in: "anon 1\n", key: "inactive_file"},
		{name: "empty file", in: "", key: "usage_usec"},
		{name: "first occurrence wins", in: "a 1\na 2\n", key: "a", want: 1, wantOK: true},
		{name: "no trailing newline", in: "a 1", key: "a", want: 1, wantOK: true},
		{name: "bad value elsewhere", in: "a 1\nb x\n", key: "a", wantErr: `line 2 "b x": token "x"`},
		{name: "three fields", in: "a 1 2\n", key: "a", wantErr: `line 1 "a 1 2": want "key value", got 3 fields`},
		{name: "negative", in: "a -1\n", key: "a", wantErr: `token "-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := parseKeyed([]byte(tc.in), tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseKeyed = %d, %v, %v; want error containing %q", got, ok, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || ok != tc.wantOK {
				t.Fatalf("parseKeyed = %d, %v, %v; want %d, %v", got, ok, err, tc.want, tc.wantOK)
			}
		})
	}
}

func TestParseProcs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    uint32
		wantErr bool
	}{
		{in: "", want: 0},
		{in: "4211\n", want: 1},
		{in: "4211\n4230\n4301\n", want: 3},
		{in: "4211\nabc\n", wantErr: true},
		{in: "0\n0\n4211\n", want: 3}, // v2, read from a pid namespace the first two are outside of
		{in: "-1\n", wantErr: true},
	} {
		t.Run(strconv.Quote(tc.in), func(t *testing.T) {
			got, err := parseProcs([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseProcs(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseProcCgroup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    procCgroup
		wantErr string
	}{
		{name: "unified", in: "0::/kubepods/pod1/abc\n", want: procCgroup{V1: map[string]string{}, Unified: "/kubepods/pod1/abc", HasUnified: true}},
		{name: "legacy, cpu and cpuacct co-mounted",
			in:   "8:cpu,cpuacct:/statstest/pause\n7:memory:/statstest/pause\n1:name=systemd:/x\n",
			want: procCgroup{V1: map[string]string{"cpu": "/statstest/pause", "cpuacct": "/statstest/pause", "memory": "/statstest/pause", "name=systemd": "/x"}}},
		{name: "hybrid", in: "4:memory:/statstest/pause\n2:cpuacct:/statstest/pause\n0::/\n",
			want: procCgroup{V1: map[string]string{"memory": "/statstest/pause", "cpuacct": "/statstest/pause"}, Unified: "/", HasUnified: true}},
		{name: "path with a colon", in: "0::/a:b\n", want: procCgroup{V1: map[string]string{}, Unified: "/a:b", HasUnified: true}},
		{name: "namespace-relative path outside the namespace", in: "0::/../../pod1\n", want: procCgroup{V1: map[string]string{}, Unified: "/../../pod1", HasUnified: true}},
		{name: "missing field", in: "0:/\n", wantErr: `want "id:controllers:path"`},
		{name: "bad id", in: "x:memory:/\n", wantErr: `token "x"`},
		{name: "relative path", in: "4:memory:a\n", wantErr: `token "a"`},
		{name: "v1 without controllers", in: "4::/a\n", wantErr: "without controllers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcCgroup([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseProcCgroup = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseProcCgroup mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestInRootOnly: a process is "in the root only" when no hierarchy, v1 or
// v2, places it below "/" (SandboxProcesses then needs descent alone).
func TestInRootOnly(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"0::/\n", true},
		{"", true},
		{"4:memory:/\n2:cpuacct:/\n1:name=systemd:/\n0::/\n", true},
		{"0::/user.slice/user-0.slice/session-1.scope\n", false},
		{"4:memory:/\n1:name=systemd:/user.slice\n0::/\n", false},
		{"4:memory:/statstest/pause\n0::/\n", false},
	} {
		pc, err := parseProcCgroup([]byte(tc.in))
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got := pc.inRootOnly(); got != tc.want {
			t.Errorf("inRootOnly(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestSelectLocation(t *testing.T) {
	// Mounts as a worker in a private cgroup namespace may have them: made
	// inside it (root "/"), the host's inherited into it (root "/.."), or a
	// container's own cgroup bind-mounted without a namespace.
	inNS := mountRoots{mem: mountRoot{dir: "/sys/fs/cgroup", root: "/"}, cpu: mountRoot{dir: "/sys/fs/cgroup", root: "/"}}
	hostInNS := mountRoots{mem: mountRoot{dir: "/sys/fs/cgroup", root: "/.."}, cpu: mountRoot{dir: "/sys/fs/cgroup", root: "/.."}}
	bound := mountRoots{mem: mountRoot{dir: "/sys/fs/cgroup/memory", root: "/kubepods/pod1"}, cpu: mountRoot{dir: "/sys/fs/cgroup/cpuacct", root: "/kubepods/pod1"}}
	const leaf = "/8a649775-1366-4797-880d-37b0af097baf-_pause"
	for _, tc := range []struct {
		name    string
		in      string
		mode    Mode
		mr      mountRoots
		want    *location
		wantErr string
	}{
		{name: "unified", in: "0::/a/b\n", mode: ModeUnified, want: &location{mem: "/a/b", cpu: "/a/b"}},
		{name: "hybrid ignores 0::/", in: "4:memory:/m\n2:cpuacct:/c\n0::/\n", mode: ModeHybrid, want: &location{mem: "/m", cpu: "/c"}},
		{name: "legacy without cpuacct", in: "4:memory:/m\n", mode: ModeLegacy, want: &location{mem: "/m"}},
		{name: "memory cgroup of its own, cpuacct root", in: "4:memory:/m\n2:cpuacct:/\n0::/\n", mode: ModeHybrid,
			want: &location{mem: "/m", cpuWhy: "the sentry's cpuacct cgroup is the root: its counter would be the whole host's CPU"}},
		{name: "root cgroup (unified)", in: "0::/\n", mode: ModeUnified, wantErr: "root cgroup"},
		{name: "root cgroup (v1)", in: "4:memory:/\n2:cpuacct:/\n0::/\n", mode: ModeHybrid, wantErr: "root cgroup"},
		{name: "outside the namespace", in: "0::/../x\n", mode: ModeUnified, wantErr: "outside this process's cgroup namespace"},
		{name: "deleted", in: "0::/x (deleted)\n", mode: ModeUnified, wantErr: "no such cgroup"},
		{name: "hybrid without memory", in: "0::/x\n", mode: ModeHybrid, wantErr: "no v1 memory line"},
		{name: "upstream leaf, mount made in the namespace", in: "0::" + leaf + "\n", mode: ModeUnified, mr: inNS,
			want: &location{mem: leaf, cpu: leaf}},
		{name: "upstream leaf, the host's mount in the namespace", in: "0::" + leaf + "\n", mode: ModeUnified, mr: hostInNS,
			wantErr: `the cgroup mount at /sys/fs/cgroup is rooted at "/..", outside this process's cgroup namespace`},
		{name: "v1, the host's memory mount in the namespace", in: "4:memory:" + leaf + "\n2:cpuacct:" + leaf + "\n", mode: ModeLegacy, mr: hostInNS,
			wantErr: "outside this process's cgroup namespace"},
		{name: "v1, a container's cgroup bind-mounted", in: "4:memory:/kubepods/pod1" + leaf + "\n2:cpuacct:/kubepods/pod1" + leaf + "\n0::/\n", mode: ModeHybrid, mr: bound,
			want: &location{mem: leaf, cpu: leaf}},
		{name: "v1, the mount's own root", in: "4:memory:/kubepods/pod1\n2:cpuacct:/kubepods/pod1\n", mode: ModeLegacy, mr: bound,
			want: &location{mem: "/", cpu: "/"}},
		{name: "v1, outside the bind-mounted cgroup", in: "4:memory:/kubepods/pod2" + leaf + "\n", mode: ModeLegacy, mr: bound,
			wantErr: `cgroup "/kubepods/pod2` + leaf + `" is outside the cgroup mount at /sys/fs/cgroup/memory, whose root is "/kubepods/pod1"`},
		{name: "v1, a sibling whose name extends the mount's root", in: "4:memory:/kubepods/pod10" + leaf + "\n", mode: ModeLegacy, mr: bound,
			wantErr: "is outside the cgroup mount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := parseProcCgroup([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			got, err := selectLocation(pc, tc.mode, tc.mr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("selectLocation = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(location{})); diff != "" {
				t.Errorf("selectLocation mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// The fuzz targets run their seeds under plain `go test`; run one with
// `go test -fuzz FuzzParseKeyed ./internal/gvisor`.

func FuzzParseSingleUint(f *testing.F) {
	for _, s := range []string{"268435456\n", "0", "max\n", "", "-1", "1 2", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseSingleUint([]byte(s))
		if err != nil {
			return
		}
		// Round trip: the canonical form of v parses back to v.
		if w, err := parseSingleUint([]byte(strconv.FormatUint(v, 10) + "\n")); err != nil || w != v {
			t.Fatalf("round trip of %d = %d, %v", v, w, err)
		}
	})
}

func FuzzParseKeyed(f *testing.F) {
	f.Add("usage_usec 255682\nuser_usec 120000\n", "usage_usec")
	f.Add("anon 1\ninactive_file 3\n", "inactive_file")
	f.Add("a 1 2\n", "a")
	f.Add("a x\n", "a")
	f.Add("", "a")
	f.Add("a 1\n", "a\u2000b")
	f.Fuzz(func(t *testing.T, s, key string) {
		v, ok, err := parseKeyed([]byte(s), key)
		if err != nil {
			return
		}
		if !ok && v != 0 {
			t.Fatalf("key absent but value %d", v)
		}
		// A well-formed file stays well formed with a line appended, and
		// the first occurrence still wins.
		// strings.Fields splits on every unicode.IsSpace rune, not just
		// ASCII space: a key holding one is no key.
		if strings.ContainsFunc(key, unicode.IsSpace) || key == "" {
			return
		}
		s2 := s + "\n" + key + " 42\n"
		v2, ok2, err := parseKeyed([]byte(s2), key)
		if err != nil || !ok2 || (ok && v2 != v) || (!ok && v2 != 42) {
			t.Fatalf("appending %q: %d, %v, %v (before %d, %v)", key+" 42", v2, ok2, err, v, ok)
		}
	})
}

func FuzzParseProcs(f *testing.F) {
	for _, s := range []string{"", "4211\n", "4211\n4230\n", "0\n", "x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseProcs([]byte(s))
		if err != nil {
			return
		}
		if int(n) > strings.Count(s, "\n")+1 {
			t.Fatalf("%d processes from %d lines", n, strings.Count(s, "\n")+1)
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	for _, s := range []string{
		"0::/kubepods/pod1\n",
		"8:cpu,cpuacct:/statstest/pause\n7:memory:/statstest/pause\n0::/\n",
		"0::/../../x\n", "0::/x (deleted)\n", "x:y\n", "4::/a\n", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pc, err := parseProcCgroup([]byte(s))
		if err != nil {
			return
		}
		for c, p := range pc.V1 {
			if c == "" || !strings.HasPrefix(p, "/") {
				t.Fatalf("controller %q path %q", c, p)
			}
		}
		for _, m := range []Mode{ModeUnified, ModeHybrid, ModeLegacy} {
			loc, err := selectLocation(pc, m, mountRoots{})
			if err != nil {
				continue
			}
			for _, p := range []string{loc.mem, loc.cpu} {
				if p != "" && (!strings.HasPrefix(p, "/") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..")) {
					t.Fatalf("mode %v: selected path %q escapes", m, p)
				}
			}
		}
	})
}

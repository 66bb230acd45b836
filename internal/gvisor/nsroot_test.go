package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestFindNSRoot: the scan for this process's cgroup in a tree whose
// cgroup.procs files list pids as a reader in a private pid namespace sees
// them (v2: 0 for a process outside it).
func TestFindNSRoot(t *testing.T) {
	// procs: cgroup (a path in the mount) -> its cgroup.procs.
	base := map[string]string{
		"/system.slice/containerd.service":          "0\n0\n",
		"/kubepods.slice/podA/c1":                   "0\n",
		"/kubepods.slice/podS/statsd":               "0\n7\n",
		"/kubepods.slice/podS/statsnri":             "0\n",
		"/kubepods.slice/podS/statsd-sub/moved/x/y": "7\n", // deeper than the namespace: never looked at
		"/user.slice/user-0.slice/session-1.scope":  "7010\n1701\n",
	}
	for _, tc := range []struct {
		name     string
		procs    map[string]string // added to base
		root     string
		own      string
		pid      int
		deadline time.Duration
		want     string
		wantErr  string
	}{
		{name: "host root three levels up", root: "/../../..", own: "/", pid: 7, want: "/kubepods.slice/podS/statsd"},
		{name: "moved into a child of the namespace's root", root: "/../../..", own: "/inner", pid: 8,
			procs: map[string]string{"/kubepods.slice/podS/statsd/inner": "0\n8\n"}, want: "/kubepods.slice/podS/statsd"},
		{name: "a mount of an ancestor", root: "/../..", own: "/", pid: 9,
			procs: map[string]string{"/podS/x": "9\n"}, want: "/podS/x"},
		{name: "listed as 0 only (outside the pid namespace)", root: "/../../..", own: "/", pid: 1, wantErr: "lists pid 1"},
		{name: "a pid is matched whole", root: "/../../..", own: "/", pid: 701, wantErr: "lists pid 701"},
		{name: "two cgroups list it", root: "/../../..", own: "/", pid: 7,
			procs: map[string]string{"/a/b/c": "7\n"}, wantErr: "all list pid 7"},
		{name: "a mount beside the namespace", root: "/../x", own: "/", pid: 7, wantErr: "beside this namespace's"},
		{name: "too deep", root: strings.Repeat("/..", maxNSDepth+1), own: "/", pid: 7, wantErr: "more than 16 levels"},
		{name: "own cgroup outside its namespace", root: "/../../..", own: "/../a", pid: 7, wantErr: "outside its cgroup namespace"},
		{name: "deadline", root: "/../../..", own: "/", pid: 7, deadline: -time.Second, wantErr: "deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, m := range []map[string]string{base, tc.procs} {
				for cg, procs := range m {
					writeFile(t, filepath.Join(dir, cg, "cgroup.procs"), procs)
				}
			}
			if tc.deadline == 0 {
				tc.deadline = time.Minute
			}
			got, err := findNSRoot(dir, tc.root, tc.own, tc.pid, time.Now().Add(tc.deadline))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("findNSRoot = %q, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findNSRoot = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestJoinWithin(t *testing.T) {
	for _, tc := range []struct {
		nsRoot, p, want string
		ok              bool
	}{
		{"/k/podS/statsd", "/", "/k/podS/statsd", true},
		{"/k/podS/statsd", "/x", "/k/podS/statsd/x", true},
		{"/k/podS/statsd", "/../../podR/leaf", "/k/podR/leaf", true},
		{"/k/podS/statsd", "/../../..", "/", true},
		{"/k/podS/statsd", "/../../../../etc", "", false},
		{"/", "/../x", "", false},
	} {
		got, ok := joinWithin(tc.nsRoot, tc.p)
		if got != tc.want || ok != tc.ok {
			t.Errorf("joinWithin(%q, %q) = %q, %v; want %q, %v", tc.nsRoot, tc.p, got, ok, tc.want, tc.ok)
		}
	}
}

// TestSentryOutsideNamespace: statsd in a container with a private cgroup
// namespace (containerd's on a v2 node), the host's cgroup file system
// bind-mounted: the sentry's /proc/<pid>/cgroup path ("/../../podR/leaf")
// is read where statsd's namespace is in the host's tree, never by its names
// alone (a decoy cgroup at those names holds other numbers), and the pin by
// start time still holds.
func TestSentryOutsideNamespace(t *testing.T) {
	const statsd = "/kubepods/podS/statsd" // the namespace's root: statsd's cgroup
	me := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name      string
		mountRoot string
		procPath  string // the sentry's cgroup as statsd's namespace shows it
		sandbox   string // where the sentry's cgroup is in the mount
		listed    string // statsd's cgroup.procs
		wantErr   string
	}{
		{name: "the kernel's path", mountRoot: "/../../..", procPath: "/../../podR/leaf", sandbox: "/kubepods/podR/leaf", listed: "0\n" + me + "\n"},
		{name: "through the host's root", mountRoot: "/../../..", procPath: "/../../../kubepods/podR/leaf", sandbox: "/kubepods/podR/leaf", listed: me + "\n"},
		{name: "a mount of /kubepods", mountRoot: "/../..", procPath: "/../../podR/leaf", sandbox: "/podR/leaf", listed: me + "\n"},
		{name: "statsd's cgroup not found", mountRoot: "/../../..", procPath: "/../../podR/leaf", sandbox: "/kubepods/podR/leaf", listed: "0\n",
			wantErr: "mount the host's whole cgroup file system"},
		{name: "above the mount", mountRoot: "/../..", procPath: "/../../../system.slice/leaf", sandbox: "/podR/leaf", listed: me + "\n",
			wantErr: "leads above the cgroup mount"},
		{name: "the host's root", mountRoot: "/../../..", procPath: "/../../..", sandbox: "/kubepods/podR/leaf", listed: me + "\n",
			wantErr: "root cgroup"},
		{name: "a mount made in the namespace", mountRoot: "/", procPath: "/../../podR/leaf", sandbox: "/podR/leaf", listed: me + "\n",
			wantErr: "holds only the namespace's cgroups"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := t.TempDir()
			mountStatsd := statsd
			if tc.mountRoot == "/../.." {
				mountStatsd = strings.TrimPrefix(statsd, "/kubepods")
			}
			writeFile(t, filepath.Join(cg, mountStatsd, "cgroup.procs"), tc.listed)
			if err := os.CopyFS(filepath.Join(cg, tc.sandbox), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
				t.Fatal(err)
			}
			if tc.sandbox != "/podR/leaf" {
				// The names alone, cleaned from the root: another cgroup.
				if err := os.CopyFS(filepath.Join(cg, "podR", "leaf"), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
					t.Fatal(err)
				}
			}
			proc := t.TempDir()
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::"+tc.procPath+"\n")
			writeStat(t, proc, 42, 5000)
			writeFile(t, filepath.Join(proc, "self", "cgroup"), "0::/\n")
			writeFile(t, filepath.Join(proc, "self", "mountinfo"), fmt.Sprintf(
				"1 0 0:1 / / rw - ext4 /dev/vda rw\n987654 1 0:32 %s %s ro,relatime - cgroup2 cgroup2 rw\n", tc.mountRoot, cg))
			s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42})
			checkSentrySample(t, s, cg, tc.sandbox, tc.wantErr)
		})
	}
}

// checkSentrySample samples s (bound by sentry pid 42 on a v2 fixture tree
// cg) and checks it: not measurable (never gone) saying wantErr, or, with
// wantErr "", the fixture sandbox's 268435456 bytes read at sandbox in cg.
func checkSentrySample(t *testing.T, s source.Source, cg, sandbox, wantErr string) {
	t.Helper()
	r, err := s.Sample(context.Background())
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) || !errors.Is(err, source.ErrNotMeasurable) || errors.Is(err, source.ErrSandboxGone) {
			t.Fatalf("sample = %q (current %d), %v; want not measurable (never gone) saying %q", r.Detail, r.MemoryCurrentBytes, err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := display(mustRoot(t, cg), sandbox) + " (sentry pid 42)"; !strings.HasSuffix(r.Detail, want) || r.MemoryCurrentBytes != 268435456 {
		t.Errorf("sample = %q, current %d; want %q and the sandbox's 268435456", r.Detail, r.MemoryCurrentBytes, want)
	}
}

func TestPidsHidden(t *testing.T) {
	for _, tc := range []struct {
		name, self string // self: the link's target; "" a directory
		want       bool
	}{
		{name: "the host's pid namespace", self: strconv.Itoa(os.Getpid())},
		{name: "a pid namespace of its own", self: "4242", want: true},
		{name: "a fixture tree", self: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			var err error
			if tc.self == "" {
				err = os.Mkdir(filepath.Join(proc, "self"), 0o755)
			} else {
				err = os.Symlink(tc.self, filepath.Join(proc, "self"))
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := pidsHidden(proc); got != tc.want {
				t.Errorf("pidsHidden = %v, want %v", got, tc.want)
			}
		})
	}
}

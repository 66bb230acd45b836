package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func TestParseMountinfo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []mountInfo
		wantErr string
	}{
		{name: "hybrid host", in: "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
			"36 31 0:33 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n",
			want: []mountInfo{
				{ID: 31, Root: "/", MountPoint: "/sys/fs/cgroup", FSType: "tmpfs"},
				{ID: 36, Root: "/", MountPoint: "/sys/fs/cgroup/memory", FSType: "cgroup"},
			}},
		{name: "the host's mount seen from a worker's cgroup namespace", in: "35 31 0:32 /.. /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
			want: []mountInfo{{ID: 35, Root: "/..", MountPoint: "/sys/fs/cgroup/memory", FSType: "cgroup"}}},
		{name: "a container's cgroup bind-mounted", in: "812 800 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n",
			want: []mountInfo{{ID: 812, Root: "/kubepods/pod1", MountPoint: "/sys/fs/cgroup", FSType: "cgroup2"}}},
		{name: "escaped space in a path", in: "40 31 0:40 /a\\040b /mnt/x\\134y rw - cgroup2 cgroup2 rw\n",
			want: []mountInfo{{ID: 40, Root: "/a b", MountPoint: `/mnt/x\y`, FSType: "cgroup2"}}},
		{name: "empty", in: ""},
		{name: "no separator", in: "31 23 0:28 / /sys/fs/cgroup rw,relatime tmpfs tmpfs rw\n", wantErr: "want"},
		{name: "id not a number", in: "x 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", wantErr: "mount id"},
		{name: "relative root", in: "31 23 0:28 a /sys/fs/cgroup rw - tmpfs tmpfs rw\n", wantErr: "not absolute"},
		{name: "truncated escape", in: "31 23 0:28 / /a\\04 rw - tmpfs tmpfs rw\n", wantErr: "truncated escape"},
		{name: "bad escape", in: "31 23 0:28 / /a\\09x rw - tmpfs tmpfs rw\n", wantErr: "bad escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMountinfo([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseMountinfo = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseMountinfo mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseMountinfo(f *testing.F) {
	for _, s := range []string{
		"36 31 0:33 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n",
		"35 31 0:32 /.. /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
		"812 800 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
		"40 31 0:40 /a\\040b /mnt/x rw - cgroup2 cgroup2 rw\n", "x\n", "1 2 3 / / o -\n", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mounts, err := parseMountinfo([]byte(s))
		if err != nil {
			return
		}
		for _, m := range mounts {
			if !strings.HasPrefix(m.Root, "/") || !strings.HasPrefix(m.MountPoint, "/") || m.FSType == "" {
				t.Fatalf("parsed %+v", m)
			}
			// Whatever the mount's root, a path inside it never leaves it.
			for _, p := range []string{"/a-_pause", m.Root, m.Root + "/x"} {
				if hasDotDot(p) {
					continue
				}
				got, err := mountRoot{dir: "/sys/fs/cgroup", root: m.Root}.inMount(p)
				if err == nil && (!strings.HasPrefix(got, "/") || hasDotDot(got)) {
					t.Fatalf("root %q: %q -> %q", m.Root, p, got)
				}
			}
		}
	})
}

// TestSentryInWorkerNamespace: a worker in upstream's layout, in a private
// cgroup namespace rooted at its pod, binds a sentry by pid; the sentry's
// /proc/<pid>/cgroup reads /<actorUID>-_pause, relative to that namespace.
// Read through a cgroup mount made in the namespace, that is the leaf. The
// host's mount, inherited into the namespace (mountinfo root "/.."), has no
// such path at its top: the source says so, and never that the sandbox is
// gone (a live sandbox would be recorded dead) nor reads a cgroup of that
// name at the host's root. A container's own cgroup bind-mounted (no
// namespace, root /kubepods/pod1) holds the path below its root.
func TestSentryInWorkerNamespace(t *testing.T) {
	const leaf = "8a649775-1366-4797-880d-37b0af097baf-_pause"
	for _, tc := range []struct {
		name      string
		procPath  string // the sentry's cgroup as /proc shows it
		mountRoot string // "": no mountinfo
		hostLeaf  bool   // a cgroup of the leaf's name at the top of the tree that is not the sandbox's
		wantErr   string
	}{
		{name: "mount made in the namespace", procPath: "/" + leaf, mountRoot: "/"},
		{name: "no mountinfo: the path as it is", procPath: "/" + leaf},
		{name: "the host's mount inherited into the namespace", procPath: "/" + leaf, mountRoot: "/..",
			wantErr: `rooted at "/..", outside this process's cgroup namespace`},
		{name: "the host's mount, a cgroup of that name at its root", procPath: "/" + leaf, mountRoot: "/..", hostLeaf: true,
			wantErr: `rooted at "/..", outside this process's cgroup namespace`},
		{name: "a container's cgroup bind-mounted", procPath: "/kubepods/pod1/" + leaf, mountRoot: "/kubepods/pod1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := t.TempDir()
			sandbox := filepath.Join(cg, "sandbox")
			if tc.hostLeaf {
				// The tree's /<leaf> is another cgroup: the sandbox's is not
				// at the top of this mount.
				sandbox = filepath.Join(cg, "elsewhere")
				if err := os.CopyFS(filepath.Join(cg, leaf), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
					t.Fatal(err)
				}
			} else if tc.mountRoot != "/.." {
				sandbox = filepath.Join(cg, leaf)
			}
			if err := os.CopyFS(sandbox, os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
				t.Fatal(err)
			}
			proc := t.TempDir()
			writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::"+tc.procPath+"\n")
			writeStat(t, proc, 42, 5000)
			if tc.mountRoot != "" {
				writeFile(t, filepath.Join(proc, "self", "mountinfo"), fmt.Sprintf(
					"1 0 0:1 / / rw - ext4 /dev/vda rw\n987654 1 0:32 %s %s rw,relatime - cgroup2 cgroup2 rw\n", tc.mountRoot, cg))
			}
			s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42})
			checkSentrySample(t, s, cg, "/"+leaf, tc.wantErr)
		})
	}
}

func mustRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

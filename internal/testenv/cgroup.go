package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// CgroupRoot is where the tests find the host's cgroups.
const CgroupRoot = "/sys/fs/cgroup"

// CgroupV2 reports whether CgroupRoot is a cgroup2 mount (a unified host,
// the VM lane's guest), not a v1 or hybrid tree.
func CgroupV2() bool {
	v2, err := cgroup2At(CgroupRoot)
	return err == nil && v2
}

// MakeCgroup makes each directory (a cgroup) and removes it at the end of the
// test, after the processes in it are gone: make it before starting them, so
// that their cleanup runs first.
func MakeCgroup(t testing.TB, dirs ...string) {
	t.Helper()
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := RmdirRetry(dir); err != nil {
				t.Errorf("remove cgroup %s: %v", dir, err)
			}
		})
	}
}

// JoinCgroup moves pid into each cgroup directory.
func JoinCgroup(t testing.TB, pid int, dirs ...string) {
	t.Helper()
	for _, dir := range dirs {
		p := filepath.Join(dir, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatalf("move %d into %s: %v", pid, p, err)
		}
	}
}

// CgroupUint reads the kernel's own figure from dir/name: the single number
// in it, or key's value when key is set ("usage_usec" in cpu.stat).
func CgroupUint(t testing.TB, dir, name, key string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	s, found := strings.TrimSpace(string(b)), key == ""
	if key != "" {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				s, found = v, true
			}
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if !found || err != nil {
		t.Fatalf("%s/%s %s: %q: not a number (%v)", dir, name, key, b, err)
	}
	return v
}

// Package e2e holds the whole-daemon end-to-end tests: the built statsd,
// statsagent and statsctl binaries against the real parts (real cgroups, a
// real gVisor sandbox under runsc, a real QEMU, a Kata agent fake behind a
// real Unix socket, a real Prometheus), each test named TestIntegration... .
// They need root and the packages .ci/run installs; outside CI a missing
// prerequisite skips with a hint, under CI=true it fails (testenv.Need).
// Unit and component tests live beside their packages.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestWorkloadChild is not a test: it is the workload the tests move into
// their cgroups (testenv.StartChild re-executes the test binary to run it;
// see testenv.RunChild for its commands).
func TestWorkloadChild(t *testing.T) { testenv.RunChild(t) }

// needCgroups skips (or fails under CI) unless the test runs as root on a
// host with the cgroup v1 memory and cpuacct hierarchies or on a cgroup v2
// host whose root delegates memory and cpu (the VM lane's guest).
func needCgroups(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end on real cgroups; not under -short")
	}
	testenv.Need(t, os.Geteuid() == 0, "needs root to create cgroups (run as root)")
	if testenv.CgroupV2() {
		ctl, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		f := " " + strings.TrimSpace(string(ctl)) + " "
		testenv.Need(t, strings.Contains(f, " memory ") && strings.Contains(f, " cpu "), "needs memory and cpu in /sys/fs/cgroup/cgroup.subtree_control")
		return
	}
	_, errM := os.Stat("/sys/fs/cgroup/memory/cgroup.procs")
	_, errC := os.Stat("/sys/fs/cgroup/cpuacct/cgroup.procs")
	testenv.Need(t, errM == nil && errC == nil, "needs the cgroup v1 memory and cpuacct hierarchies under /sys/fs/cgroup")
}

// needV1 is needCgroups for a test of what only a cgroup v1 host has.
func needV1(t testing.TB) {
	t.Helper()
	needCgroups(t)
	testenv.Need(t, !testenv.CgroupV2(), "needs the cgroup v1 memory hierarchy (v1 working set, blkio)")
}

// cgroupDirs are the directories of the cgroup path rel: in the v1 memory
// and cpuacct hierarchies, or the one v2 cgroup.
func cgroupDirs(rel string) []string {
	if testenv.CgroupV2() {
		return []string{filepath.Join(testenv.CgroupRoot, rel)}
	}
	return []string{filepath.Join(testenv.CgroupRoot, "memory", rel), filepath.Join(testenv.CgroupRoot, "cpuacct", rel)}
}

// testCgroup makes the cgroup path rel (cgroupDirs) and removes it at the
// end of the test (after the processes in it are gone: register it before
// starting them).
func testCgroup(t testing.TB, rel string) {
	t.Helper()
	testenv.MakeCgroup(t, cgroupDirs(rel)...)
}

// moveTo moves pid into the cgroup rel (cgroupDirs).
func moveTo(t testing.TB, rel string, pid int) {
	t.Helper()
	testenv.JoinCgroup(t, pid, cgroupDirs(rel)...)
}

func statsctl(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "statsctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("statsctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return got >= want*(1-frac) && got <= want*(1+frac) }

// series is the label set of a workload exported with --label-actor (actor
// namespace "team", template tmpl/py).
func series(actor, class, src string) string {
	return fmt.Sprintf("{actor_name=%s,actor_namespace=team,actor_uid=%s,sandbox_class=%s,source=%s,template_name=py,template_namespace=tmpl}",
		actor, actor, class, src)
}

package drift_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestHelperChild is not a test: it is the workload process the OOM test
// moves into its cgroup (testenv.StartChild re-executes the test binary to
// run it; see testenv.RunChild for its commands).
func TestHelperChild(t *testing.T) { testenv.RunChild(t) }

// TestIntegrationOOMKilled makes a cgroup with a 64 MiB limit (the test's
// own: v1 memory+cpuacct with memory.limit_in_bytes, or one v2 cgroup with
// memory.max and no swap), moves a child in and has it allocate 200 MiB: the
// kernel's OOM killer kills it. The sample shows the 64 MiB limit and one OOM
// kill, and the drift check (a Checker with the SystemObserver over the real
// cgroup) reports OOM_KILLED exactly once over three cycles, instead of
// SANDBOX_DEAD.
func TestIntegrationOOMKilled(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to create cgroups (run the tests as root)")
	name := fmt.Sprintf("sbstest-oom-%d-%d", os.Getpid(), time.Now().UnixNano())
	var dirs []string
	limit := map[string]string{}
	if testenv.CgroupV2() {
		dirs = []string{filepath.Join(testenv.CgroupRoot, name)}
		limit["memory.max"], limit["memory.swap.max"] = strconv.Itoa(64<<20), "0"
	} else {
		_, err := os.Stat("/sys/fs/cgroup/memory/memory.oom_control")
		testenv.Need(t, err == nil, "needs a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
		dirs = []string{filepath.Join(testenv.CgroupRoot, "memory", name), filepath.Join(testenv.CgroupRoot, "cpuacct", name)}
		// No swap for this cgroup, so the allocation cannot escape the limit.
		limit["memory.limit_in_bytes"], limit["memory.swappiness"] = strconv.Itoa(64<<20), "0"
	}
	testenv.MakeCgroup(t, dirs...)
	for f, v := range limit {
		if err := os.WriteFile(filepath.Join(dirs[0], f), []byte(v), 0o644); err != nil && f != "memory.swappiness" && f != "memory.swap.max" {
			t.Fatal(err)
		}
	}
	c := testenv.StartChild(t, "TestHelperChild")
	testenv.JoinCgroup(t, c.Cmd.Process.Pid, dirs...)

	s := newScenario(t, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/" + name}, time.Minute)
	s.cycle()
	s.wantEvents("alive under a 64 MiB limit")

	c.Send(t, "alloc 200")
	state, _ := c.Wait()
	t.Logf("child allocating 200 MiB under a 64 MiB limit: %v", state)

	src, err := gvisor.Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/" + name}, gvisor.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var r source.Reading
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err = src.Sample(t.Context()); err != nil {
			t.Fatal(err)
		}
		if (r.SandboxProcesses != nil && *r.SandboxProcesses == 0) || time.Now().After(deadline) {
			break
		}
	}
	m := r.Memory
	if m == nil || m.LimitBytes == nil || m.OOMKills == nil {
		t.Fatalf("memory signals %+v (absent %+v), want the limit and the OOM kill count", m, r.Absent)
	}
	t.Logf("sample: limit %+v, oom_kills %d, under_oom %v, processes %d", *m.LimitBytes, *m.OOMKills, deref(m.UnderOOM), *r.SandboxProcesses)
	if *m.LimitBytes != (source.Limit{Value: 64 << 20}) || *m.OOMKills != 1 {
		t.Errorf("limit %+v, oom_kills %d; want 64 MiB and 1", *m.LimitBytes, *m.OOMKills)
	}

	for range 3 {
		s.cycle()
	}
	s.wantEvents("OOM-killed, three cycles", "OPENED OOM_KILLED /"+name)
	for _, f := range s.checker.Open() {
		t.Logf("open finding: %s %s: %s", f.Kind, f.Subject, f.Detail)
	}
}

func deref(b *bool) any {
	if b == nil {
		return "absent"
	}
	return *b
}

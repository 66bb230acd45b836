package gvisor

import (
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestHelperChild is not a test: it is the workload process the real-cgroup
// test moves into its cgroups (testenv.StartChild re-executes the test binary
// to run it; see testenv.RunChild for its commands).
func TestHelperChild(t *testing.T) { testenv.RunChild(t) }

// mkCgroup makes dir and removes it at the end of the test.
func mkCgroup(t *testing.T, dir string) {
	t.Helper()
	testenv.MakeCgroup(t, dir)
}

// join moves pid into the cgroup dir.
func join(t *testing.T, dir string, pid int) {
	t.Helper()
	testenv.JoinCgroup(t, pid, dir)
}

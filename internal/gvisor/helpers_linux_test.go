package gvisor

import (
	"os"
	"path/filepath"
	"strconv"
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
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testenv.RmdirRetry(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func join(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move pid %d into %s: %v", pid, dir, err)
	}
}

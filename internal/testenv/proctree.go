package testenv

// A temporary /proc tree for the unit tests of its readers (gvisor,
// hoststat): files written where the kernel has them, stat lines shaped
// like the kernel's.

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// WriteProcFile writes one file of a temporary /proc tree at root (rel
// such as "4242/task/4243/stat"), its directories made as needed.
func WriteProcFile(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ProcStatLine is a full (52-field) stat line of process or thread pid,
// child of ppid, named comm, started start ticks after boot: utime 12,
// stime 30, state S.
func ProcStatLine(pid, ppid int32, comm string, start uint64) string {
	return fmt.Sprintf("%d (%s) S %d 1 1 0 -1 4194368 1200 0 3 0 12 30 0 0 20 0 6 0 %d 1234567890 6500 18446744073709551615 1 1 0 0 0 0 0 4096 17664 0 0 0 -1 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		pid, comm, ppid, start)
}

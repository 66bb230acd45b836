package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// TestQEMUStopChecksStartTime: Stop signals the pid only while it is still
// the process that was started (same start time); a pid now held by another
// process (another start time) is left alone.
func TestQEMUStopChecksStartTime(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	start := func() (*exec.Cmd, <-chan struct{}, uint64) {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Skipf("sleep: %v", err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		st, err := process.StartTime("/proc", cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return cmd, done, st
	}

	other, otherDone, st := start()
	vm := &QEMU{PID: other.Process.Pid, start: st + 1} // the pid now belongs to another process
	vm.Stop()
	select {
	case <-otherDone:
		t.Fatal("Stop signalled a process whose start time is not the recorded one (a reused pid)")
	case <-time.After(300 * time.Millisecond):
	}

	own, ownDone, st := start()
	vm = &QEMU{PID: own.Process.Pid, start: st}
	vm.Stop()
	select {
	case <-ownDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not stop the process it started")
	}
}

func TestCgroupProcsFile(t *testing.T) {
	plain := t.TempDir()
	if got, err := cgroupProcsFile(plain, "/a/b"); err != nil || got != filepath.Join(plain, "memory", "a", "b", "cgroup.procs") {
		t.Errorf("v1 (not cgroup2) root: %q, %v; want the memory hierarchy", got, err)
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st syscall.Statfs_t
		if syscall.Statfs(root, &st) != nil || int64(st.Type) != cgroup2Magic {
			continue
		}
		if got, err := cgroupProcsFile(root, "/a/b"); err != nil || got != filepath.Join(root, "a", "b", "cgroup.procs") {
			t.Errorf("cgroup2 root %s: %q, %v; want <root>/<path>/cgroup.procs", root, got, err)
		}
		return
	}
	t.Log("no cgroup2 mount here: only the v1 case checked")
}

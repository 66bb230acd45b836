package hoststat

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestVMMPinned: the VMM named by vmm_pid or a pid file is pinned at its
// first sample (start time, executable); once another process has the pid
// (the VMM exited, its pid file stayed), neither its threads nor its KVM
// directory are read as the VMM's.
func TestVMMPinned(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "srv1", "qemu.pid")
	os.MkdirAll(filepath.Dir(pidFile), 0o755)
	os.WriteFile(pidFile, []byte("4242\n"), 0o644)
	for _, tc := range []struct {
		name  string
		ref   source.SandboxRef
		reuse func(t *testing.T, root string)
	}{
		{"vmm_pid, another start time", source.SandboxRef{Class: source.ClassMicroVM, VMMPID: 4242}, func(t *testing.T, root string) {
			writeThread(t, root, 4242, 4242, "sleep")
			testenv.WriteProcFile(t, root, "4242/stat", testenv.ProcStatLine(4242, 1, "sleep", 99000))
		}},
		{"reused between the pin check and the thread read", source.SandboxRef{Class: source.ClassMicroVM, VMMPID: 4242}, func(t *testing.T, root string) {
			testenv.WriteProcFile(t, root, "4242/task/4242/stat", testenv.ProcStatLine(4242, 1, "sleep", 99000))
		}},
		{"pid file, another executable", source.SandboxRef{Class: source.ClassMicroVM, VMMPIDFile: pidFile}, func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "4242", "exe"))
			os.Symlink("/usr/bin/sleep", filepath.Join(root, "4242", "exe"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "proc")
			if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "proc"))); err != nil {
				t.Fatal(err)
			}
			os.Symlink("/usr/bin/qemu-system-x86_64", filepath.Join(root, "4242", "exe"))
			s, err := newSampler(tc.ref, Config{ProcRoot: root, DebugfsRoot: filepath.Join("testdata", "debugfs-5.4"),
				ReadTimeout: time.Second, DisableDebugfsMount: true, Now: fixedNow})
			if err != nil {
				t.Fatal(err)
			}
			hs, _ := s.SampleHost(context.Background())
			if hs.VMMThreads.Error != "" || len(hs.VMMThreads.Threads) == 0 || hs.KVM.Debugfs.State != source.KVMSourceStateAvailable {
				t.Fatalf("first sample: threads %q (%d), debugfs %v", hs.VMMThreads.Error, len(hs.VMMThreads.Threads), hs.KVM.Debugfs.State)
			}
			tc.reuse(t, root)
			hs, _ = s.SampleHost(context.Background())
			if !strings.Contains(hs.VMMThreads.Error, "names another process") || len(hs.VMMThreads.Threads) != 0 {
				t.Errorf("after reuse: threads error %q, %d threads; want the pid refused", hs.VMMThreads.Error, len(hs.VMMThreads.Threads))
			}
			if d := hs.KVM.Debugfs; d.State != source.KVMSourceStateUnavailable || !strings.Contains(d.Reason, "names another process") || len(d.Counters) != 0 {
				t.Errorf("after reuse: debugfs %v %q, %d counters", d.State, d.Reason, len(d.Counters))
			}
		})
	}
}

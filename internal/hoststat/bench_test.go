package hoststat_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// benchVMM returns the proc root, a SandboxRef for a 2-vCPU QEMU (a real
// one, KVM or TCG, when qemu-system-x86_64 and root are available, else the
// fixture tree) and the VMM pid.
func benchVMM(b *testing.B) (procRoot string, ref source.SandboxRef, pid int, what string) {
	b.Helper()
	_, err := exec.LookPath("qemu-system-x86_64")
	if err != nil || os.Geteuid() != 0 {
		return filepath.Join("testdata", "proc"), source.SandboxRef{VMMPIDFile: filepath.Join("testdata", "srv1", "qemu.pid")}, 4242, "fixture tree"
	}
	accel := testenv.Accel()
	// The prerequisites were checked above, so StartQEMU cannot fail on them.
	vm := testenv.StartQEMU(b, b.TempDir(), "srv1", accel)
	vm.WaitReady(5 * time.Second)
	return "/proc", source.SandboxRef{VMMPIDFile: vm.PIDFile, QMPSocket: vm.QMP}, vm.PID, "real QEMU -accel " + accel
}

// BenchmarkHostSample compares a full host sample of a 2-vCPU VMM with
// reading the same /proc files in a plain os.ReadFile loop.
//
//	baseline:   task/*/{stat,schedstat,comm} and /proc/stat, os.ReadFile loop
//	threads:    the sampler with the KVM sources off (same files, parsed, bounded)
//	threads+debugfs, threads+qmp: one KVM source on
//	sampler:    the full host sample: kernel, threads, debugfs (private mount
//	            when unmounted), QMP query-stats when a socket is given
func BenchmarkHostSample(b *testing.B) {
	procRoot, ref, pid, what := benchVMM(b)
	b.Logf("VMM: %s, pid %d", what, pid)
	task := filepath.Join(procRoot, strconv.Itoa(pid), "task")
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			ents, err := os.ReadDir(task)
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range ents {
				for _, f := range []string{"stat", "schedstat", "comm"} {
					os.ReadFile(filepath.Join(task, e.Name(), f))
				}
			}
			if _, err := os.ReadFile(filepath.Join(procRoot, "stat")); err != nil {
				b.Fatal(err)
			}
		}
	})
	run := func(name string, ref source.SandboxRef, cfg hoststat.Config) {
		b.Run(name, func(b *testing.B) {
			cfg.ProcRoot = procRoot
			cfg.ReadTimeout = 2 * time.Second
			s, err := hoststat.Open(ref, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for b.Loop() {
				hs, err := s.SampleHost(context.Background())
				if err != nil || hs.VMMThreads.Error != "" {
					b.Fatalf("%v %+v", err, hs)
				}
			}
		})
	}
	threadsOnly := ref
	threadsOnly.QMPSocket = ""
	run("threads", threadsOnly, hoststat.Config{DebugfsRoot: b.TempDir(), DisableDebugfsMount: true})
	run("threads+debugfs", threadsOnly, hoststat.Config{DebugfsRoot: debugfsRootFor(procRoot)})
	if ref.QMPSocket != "" {
		run("threads+qmp", ref, hoststat.Config{DebugfsRoot: b.TempDir(), DisableDebugfsMount: true})
	}
	run("sampler", ref, hoststat.Config{DebugfsRoot: debugfsRootFor(procRoot)})
}

func debugfsRootFor(procRoot string) string {
	if procRoot == "/proc" {
		return hoststat.DefaultDebugfsRoot
	}
	return filepath.Join("testdata", "debugfs-5.4")
}

// Package testenv starts the real parts end-to-end tests need (a gVisor
// sandbox under Debian's runsc, a QEMU process) and checks their
// prerequisites: a missing one skips the test with a hint, or fails it when
// CI=true, because CI installs everything the tests need. Only tests import
// it.
package testenv

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// Need skips the test with hint when ok is false, or fails it under CI=true.
func Need(t testing.TB, ok bool, hint string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing (CI=true): %s", hint)
	}
	t.Skip(hint)
}

// RmdirRetry removes a cgroup directory, retrying while its last processes
// are still leaving it.
func RmdirRetry(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("rmdir %s: %w", dir, err)
}

// BusyboxStatic returns the path of a statically linked busybox, or "".
func BusyboxStatic() string {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p
		}
	}
	return ""
}

// QEMU is a daemonized QEMU with no guest (SeaBIOS only), 2 vCPUs, named
// guest=<name>, its pid file in <dir>/<name>/qemu.pid and a QMP socket. The
// test's cleanup stops it by its pid.
type QEMU struct {
	Dir, PIDFile, QMP string
	PID               int
	start             uint64 // PID's start time (stat field 22) when it was started
}

// Accel returns "kvm" when /dev/kvm exists, else "tcg": /dev/kvm belongs to
// the machine and cannot be installed.
func Accel() string {
	if _, err := os.Stat("/dev/kvm"); err == nil {
		return "kvm"
	}
	return "tcg"
}

// NeedQEMU checks the prerequisites of StartQEMU (qemu-system-x86_64 and
// root) and returns the QEMU binary's path.
func NeedQEMU(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	Need(t, err == nil, "qemu-system-x86_64 not found: apt-get install -y --no-install-recommends qemu-system-x86")
	Need(t, os.Geteuid() == 0, "the QEMU tests read other processes' files: run as root")
	return bin
}

// StartQEMU starts QEMU with the given accelerator.
func StartQEMU(t testing.TB, dir, name, accel string) *QEMU {
	t.Helper()
	bin := NeedQEMU(t)
	vm := &QEMU{Dir: dir, PIDFile: filepath.Join(dir, name, "qemu.pid"), QMP: filepath.Join(dir, name+"-qmp.sock")}
	if err := os.MkdirAll(filepath.Dir(vm.PIDFile), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-accel", accel, "-name", "guest="+name+",debug-threads=on", "-smp", "2", "-m", "128",
		"-nodefaults", "-display", "none", "-daemonize", "-pidfile", vm.PIDFile,
		"-qmp", "unix:"+vm.QMP+",server=on,wait=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("qemu -accel %s: %v: %s", accel, err, stderr.String())
	}
	var err error
	if vm.PID, err = process.ReadPIDFile(vm.PIDFile); err != nil {
		t.Fatal(err)
	}
	if vm.start, err = process.StartTime("/proc", vm.PID); err != nil {
		t.Fatalf("qemu pid %d: %v", vm.PID, err)
	}
	t.Cleanup(vm.Stop)
	return vm
}

// WaitReady waits up to timeout for QEMU's QMP socket and at least four
// threads (the main loop, call_rcu and the two vCPUs); it returns even when
// they do not appear, leaving the test's own checks to report what is missing.
func (vm *QEMU) WaitReady(timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(vm.PID) + "/task")
		if _, err := os.Stat(vm.QMP); err == nil && len(ents) >= 4 {
			return
		}
	}
}

// alive reports whether vm.PID is still the QEMU that was started (same
// start time), not gone (a zombie counts as gone) and not a reused pid.
func (vm *QEMU) alive() bool {
	st, err := process.StartTime("/proc", vm.PID)
	return err == nil && st == vm.start
}

// Stop stops QEMU by its pid (SIGTERM, then SIGKILL) and waits for it. Before
// each signal it checks that the pid is still that QEMU (its start time), so
// a reused pid is never signalled.
func (vm *QEMU) Stop() {
	if !vm.alive() {
		return
	}
	if err := syscall.Kill(vm.PID, syscall.SIGTERM); err != nil {
		return
	}
	if vm.waitGone(10 * time.Second) {
		return
	}
	// Killed, QEMU leaves its pid file behind.
	if !vm.alive() {
		return
	}
	syscall.Kill(vm.PID, syscall.SIGKILL)
	vm.waitGone(5 * time.Second)
}

// waitGone waits up to d for the QEMU to be gone (its pid gone or reused).
func (vm *QEMU) waitGone(d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !vm.alive() {
			return true
		}
	}
	return false
}

// SyncBuffer is a bytes.Buffer safe for a daemon's logger and the test
// reading it at the same time.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

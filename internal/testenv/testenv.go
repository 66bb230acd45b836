// Package testenv starts the real parts end-to-end tests need (a gVisor
// sandbox under Debian's runsc, a QEMU process) and checks their
// prerequisites: a missing one skips the test with a hint, or fails it when
// CI=true, because CI installs everything the tests need. Only tests import
// it.
package testenv

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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

// Sandbox is a real gVisor sandbox started with runsc (--platform=ptrace,
// --network=none unless SandboxOptions.NetNS says otherwise) from an OCI
// bundle whose rootfs is busybox-static. The test's cleanup deletes it and
// every cgroup runsc made for it (runsc leaves the parent in every v1
// hierarchy).
type Sandbox struct {
	ID         string
	CgroupPath string // linux.cgroupsPath, e.g. /sbstest-123-456/pause
	PID        int    // the sentry (runsc-sandbox)
	shared     bool   // CgroupPath came from the caller and may hold other sandboxes
	netns      string // SandboxOptions.NetNS
	bin        string
	runscRoot  string
	bundle     string
	logs       string
}

// SandboxOptions configure StartSandboxWith; the zero value is
// StartSandbox's sandbox.
type SandboxOptions struct {
	// CgroupPath is linux.cgroupsPath; "" makes a fresh one.
	CgroupPath string
	// MemoryLimit, when positive, is linux.resources.memory.limit in bytes
	// (runsc writes it to the sandbox cgroup).
	MemoryLimit int64
	// NetNS, when set, is a network namespace path (/run/netns/<name>, see
	// NetNSPair): the sandbox joins it (linux.namespaces) with runsc's
	// sandbox network (--network=sandbox), and every runsc command runs in
	// it, since the sandbox's control socket is an abstract Unix socket of
	// that namespace. Empty: --network=none, in a namespace of its own
	// holding only loopback.
	NetNS string
}

// NeedRunsc checks the prerequisites of a real sandbox and returns the
// runsc and busybox paths.
func NeedRunsc(t testing.TB) (runsc, busybox string) {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root for runsc (run the tests as root)")
	runsc, err := exec.LookPath("runsc")
	Need(t, err == nil, "needs runsc in PATH (apt-get install runsc)")
	busybox = BusyboxStatic()
	Need(t, busybox != "", "needs a static busybox (apt-get install busybox-static)")
	return runsc, busybox
}

// UniqueCgroupPath returns a fresh cgroupsPath for a sandbox.
func UniqueCgroupPath() string {
	return fmt.Sprintf("/sbstest-%d-%d/pause", os.Getpid(), time.Now().UnixNano())
}

// StartSandbox starts a sandbox in cgroupPath ("" for a fresh one) whose init
// runs args. The cleanup fails the test when a fresh cgroup cannot be
// removed; a cgroupPath given by the caller may still hold another sandbox,
// so EBUSY on it is tolerated.
func StartSandbox(t testing.TB, cgroupPath string, args ...string) *Sandbox {
	t.Helper()
	return StartSandboxWith(t, SandboxOptions{CgroupPath: cgroupPath}, args...)
}

// StartSandboxWith is StartSandbox with options.
func StartSandboxWith(t testing.TB, opts SandboxOptions, args ...string) *Sandbox {
	t.Helper()
	runsc, busybox := NeedRunsc(t)
	if opts.NetNS != "" {
		NeedNetNS(t)
	}
	cgroupPath := opts.CgroupPath
	shared := cgroupPath != ""
	if !shared {
		cgroupPath = UniqueCgroupPath()
	}
	sb := &Sandbox{
		ID:         fmt.Sprintf("sbstest-%d-%d", os.Getpid(), time.Now().UnixNano()),
		CgroupPath: cgroupPath,
		shared:     shared,
		netns:      opts.NetNS,
		bin:        runsc,
		runscRoot:  t.TempDir(),
		bundle:     t.TempDir(),
		logs:       t.TempDir(),
	}
	rootfs := filepath.Join(sb.bundle, "rootfs")
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "ls", "cat", "dd", "sleep", "echo", "rm", "free", "true", "nc"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sb.Runsc(t, sb.bundle, append([]string{"spec", "--"}, args...)...); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(sb.bundle, "config.json")
	var spec map[string]any
	b, err := os.ReadFile(cfgPath)
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		t.Fatalf("runsc spec: %v", err)
	}
	spec["process"].(map[string]any)["terminal"] = false
	linux, _ := spec["linux"].(map[string]any)
	if linux == nil {
		linux = map[string]any{}
		spec["linux"] = linux
	}
	linux["cgroupsPath"] = sb.CgroupPath
	if opts.MemoryLimit > 0 {
		res, _ := linux["resources"].(map[string]any)
		if res == nil {
			res = map[string]any{}
			linux["resources"] = res
		}
		res["memory"] = map[string]any{"limit": opts.MemoryLimit}
	}
	if opts.NetNS != "" {
		nss, _ := linux["namespaces"].([]any)
		for _, ns := range nss {
			if m, ok := ns.(map[string]any); ok && m["type"] == "network" {
				m["path"] = opts.NetNS
			}
		}
	}
	if b, err = json.MarshalIndent(spec, "", "  "); err == nil {
		err = os.WriteFile(cfgPath, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { sb.cleanup(t) })
	start := time.Now()
	if _, err := sb.Runsc(t, sb.bundle, "run", "-detach", sb.ID); err != nil {
		t.Fatalf("runsc run: %v (logs in %s)", err, sb.logs)
	}
	out, err := sb.Runsc(t, "", "state", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state: %q: %v", out, err)
	}
	sb.PID = st.Pid
	t.Logf("sandbox %s running (%s) in %v: sentry pid %d, cgroupsPath %s", sb.ID, st.Status, time.Since(start).Round(time.Millisecond), sb.PID, sb.CgroupPath)
	return sb
}

// Runsc runs one runsc command with the sandbox's root and flags. The
// sandbox's and runsc's output go to their own files (sharing the test's
// stdout would corrupt it); stdout is also returned.
func (sb *Sandbox) Runsc(t testing.TB, dir string, args ...string) ([]byte, error) {
	t.Helper()
	network := "--network=none"
	if sb.netns != "" {
		network = "--network=sandbox"
	}
	full := append([]string{"--root", sb.runscRoot, "--platform=ptrace", network}, args...)
	cmd := exec.Command(sb.bin, full...)
	if sb.netns != "" {
		cmd = inNetNS(sb.netns, args[0] == "run", sb.bin, full...)
	}
	cmd.Dir = dir
	name := filepath.Join(sb.logs, fmt.Sprintf("%d-%s", time.Now().UnixNano(), args[0]))
	stdout, err := os.Create(name + ".stdout")
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(name + ".stderr")
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, stdout, stderr
	runErr := cmd.Run()
	out, _ := os.ReadFile(name + ".stdout")
	if runErr != nil {
		msg, _ := os.ReadFile(name + ".stderr")
		return out, fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), runErr, bytes.TrimSpace(msg))
	}
	return out, nil
}

// Exec runs args inside the sandbox and waits for it.
func (sb *Sandbox) Exec(t testing.TB, args ...string) {
	t.Helper()
	if _, err := sb.Runsc(t, "", append([]string{"exec", sb.ID}, args...)...); err != nil {
		t.Fatal(err)
	}
}

// cgroup2Magic is CGROUP2_SUPER_MAGIC, statfs's f_type of a cgroup2 mount.
const cgroup2Magic = 0x63677270

// cgroupProcsFile is the cgroup.procs of cgroupPath under the cgroup mount
// root: <root>/<path> when root is cgroup2 (a unified host), else the v1
// memory hierarchy <root>/memory/<path>.
func cgroupProcsFile(root, cgroupPath string) (string, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", root, err)
	}
	if int64(st.Type) == cgroup2Magic {
		return filepath.Join(root, cgroupPath, "cgroup.procs"), nil
	}
	return filepath.Join(root, "memory", cgroupPath, "cgroup.procs"), nil
}

// CgroupProcs returns the pids in the sandbox's cgroup: the unified one on a
// cgroup2 host, else the v1 memory cgroup.
func (sb *Sandbox) CgroupProcs(t testing.TB) []int {
	t.Helper()
	p, err := cgroupProcsFile("/sys/fs/cgroup", sb.CgroupPath)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// KillProcesses kills every process of the sandbox but keeps its cgroup: a
// dead sandbox.
func (sb *Sandbox) KillProcesses(t testing.TB) {
	t.Helper()
	for range 50 {
		pids := sb.CgroupProcs(t)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandbox %s: processes left in its cgroup after SIGKILL", sb.ID)
}

func (sb *Sandbox) cleanup(t testing.TB) {
	if _, err := sb.Runsc(t, "", "delete", "-force", sb.ID); err != nil {
		t.Logf("cleanup: %v", err)
	}
	parent := filepath.Dir(sb.CgroupPath)
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup") // a unified host
	for _, h := range hier {
		for _, d := range []string{sb.CgroupPath, parent} {
			p := filepath.Join(h, d)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if err := RmdirRetry(p); err != nil && !(sb.shared && errors.Is(err, syscall.EBUSY)) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	if t.Failed() {
		dumpLogs(t, sb.logs)
	}
}

func dumpLogs(t testing.TB, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if len(bytes.TrimSpace(b)) > 0 {
			t.Logf("%s:\n%s", filepath.Base(f), b[:min(len(b), 4096)])
		}
	}
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
	b, err := os.ReadFile(vm.PIDFile)
	if err != nil {
		t.Fatal(err)
	}
	if vm.PID, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		t.Fatal(err)
	}
	if vm.start, err = StartTime(vm.PID); err != nil {
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

// StartTime returns field 22 (starttime, clock ticks after boot) of
// /proc/<pid>/stat, counted after the last ')' (the command name may hold
// spaces and parentheses). With the pid it names one process: a reused pid
// has another start time.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether vm.PID is still the QEMU that was started (same
// start time), not gone and not a reused pid.
func (vm *QEMU) alive() bool {
	st, err := StartTime(vm.PID)
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

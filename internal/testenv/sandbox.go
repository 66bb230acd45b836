package testenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

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

// uniqueCgroupPath returns a fresh cgroupsPath for a sandbox.
func uniqueCgroupPath() string {
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
		needNetNS(t)
	}
	cgroupPath := opts.CgroupPath
	shared := cgroupPath != ""
	if !shared {
		cgroupPath = uniqueCgroupPath()
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
	return runLogged(cmd, sb.logs, args)
}

// runLogged runs cmd, a runsc command with args after its global flags,
// its stdout and stderr to their own files under logs (sharing the test's
// stdout would corrupt it), and returns its stdout; a failure's error
// carries its stderr.
func runLogged(cmd *exec.Cmd, logs string, args []string) ([]byte, error) {
	name := filepath.Join(logs, fmt.Sprintf("%d-%s", time.Now().UnixNano(), args[0]))
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
	v2, err := cgroup2At(root)
	if err != nil {
		return "", err
	}
	if v2 {
		return filepath.Join(root, cgroupPath, "cgroup.procs"), nil
	}
	return filepath.Join(root, "memory", cgroupPath, "cgroup.procs"), nil
}

// cgroup2At reports whether root is a cgroup2 mount.
func cgroup2At(root string) (bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", root, err)
	}
	return int64(st.Type) == cgroup2Magic, nil
}

// procsFile is the sandbox's cgroupProcsFile under CgroupRoot.
func (sb *Sandbox) procsFile(t testing.TB) string {
	t.Helper()
	p, err := cgroupProcsFile(CgroupRoot, sb.CgroupPath)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Processes returns the pids in the sandbox's cgroup (cgroupProcsFile):
// none once the sandbox is dead, its cgroup kept.
func (sb *Sandbox) Processes(t testing.TB) []int {
	t.Helper()
	b, err := os.ReadFile(sb.procsFile(t))
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

// Join moves pid into the sandbox's cgroup (the one Processes reads), as
// a process left there beside the sandbox's own. Register pid's end after
// the sandbox, so that it leaves the cgroup before the cgroup is removed.
func (sb *Sandbox) Join(t testing.TB, pid int) {
	t.Helper()
	JoinCgroup(t, pid, filepath.Dir(sb.procsFile(t)))
}

// KillProcesses kills every process of the sandbox but keeps its cgroup: a
// dead sandbox.
func (sb *Sandbox) KillProcesses(t testing.TB) {
	t.Helper()
	for range 50 {
		pids := sb.Processes(t)
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
			if d == parent && sb.shared {
				// The caller's cgroup, maybe holding other sandboxes
				// (EBUSY): one try, no retries while they stay.
				if err := syscall.Rmdir(p); err != nil && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOENT) {
					t.Errorf("cleanup: rmdir %s: %v", p, err)
				}
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

// Delete deletes the sandbox now (runsc delete -force) and removes its
// cgroups, as the test's cleanup would; the cleanup then finds nothing left.
func (sb *Sandbox) Delete(t testing.TB) {
	t.Helper()
	sb.cleanup(t)
}

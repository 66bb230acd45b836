package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// RunscPod is a real gVisor sandbox with containers joined to it by the CRI
// annotations, as containerd's CRI creates a pod under runsc (section 5.5
// of the cgroups-and-gvisor reference): the first bundle is the sandbox
// (container-type sandbox, container-name pause), each next one a
// container naming it (io.kubernetes.cri.sandbox-id) with its
// container-name. runsc runs with --network=none --platform=ptrace
// (Debian's runsc has no systrap) and its own root. The test's cleanup
// kills and deletes every container and removes the cgroups runsc left.
type RunscPod struct {
	Bin          string // the runsc binary
	Root         string // runsc --root: the state files, and the control sockets of newer runsc
	CgroupParent string // the pod's cgroups are <CgroupParent>/<name>
	SandboxID    string
	IDs          []string // the sandbox's first, then the containers' in the order given
	logs         string
}

// Runsc runs runsc with the pod's root and flags in dir. Its output goes
// to files: the sandbox a create starts inherits them, and a pipe would
// keep Run waiting for the sandbox's end.
func (p *RunscPod) Runsc(t testing.TB, dir string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(p.Bin, append([]string{"--root", p.Root, "--network=none", "--platform=ptrace"}, args...)...)
	cmd.Dir = dir
	return runLogged(cmd, p.logs, args)
}

// StartRunscPod starts a sandbox running `sleep` and one container per
// entry of names, running containers[name] (its argv), in that order. The
// container ids are <name>-<tag>, the sandbox's sbstest-<tag>.
func StartRunscPod(t testing.TB, names []string, containers map[string][]string) *RunscPod {
	t.Helper()
	runsc, busybox := NeedRunsc(t)
	tag := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	// A short root: newer runsc puts its control socket there, and a
	// socket path must fit sockaddr_un.
	root, err := os.MkdirTemp("", "sbs")
	if err != nil {
		t.Fatal(err)
	}
	p := &RunscPod{Bin: runsc, Root: root, CgroupParent: "/sbstest-pod-" + tag, SandboxID: "sbstest-" + tag, logs: t.TempDir()}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cleanup(t); os.RemoveAll(root) })
	all := append([]string{"pause"}, names...)
	argv := map[string][]string{"pause": {"sleep", "100000"}}
	for k, v := range containers {
		argv[k] = v
	}
	for i, name := range all {
		id := p.SandboxID
		if i > 0 {
			id = name + "-" + tag
		}
		bundle := filepath.Join(t.TempDir(), name)
		rootfs := filepath.Join(bundle, "rootfs")
		for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc"} {
			if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, a := range []string{"sh", "sleep"} {
			if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Runsc(t, bundle, append([]string{"spec", "--"}, argv[name]...)...); err != nil {
			t.Fatal(err)
		}
		var spec map[string]any
		cfg := filepath.Join(bundle, "config.json")
		b, err := os.ReadFile(cfg)
		if err == nil {
			err = json.Unmarshal(b, &spec)
		}
		if err != nil {
			t.Fatal(err)
		}
		spec["process"].(map[string]any)["terminal"] = false
		typ := "container"
		if i == 0 {
			typ = "sandbox"
		}
		spec["annotations"] = map[string]any{
			"io.kubernetes.cri.container-type": typ,
			"io.kubernetes.cri.sandbox-id":     p.SandboxID,
			"io.kubernetes.cri.container-name": name,
		}
		spec["linux"].(map[string]any)["cgroupsPath"] = p.CgroupParent + "/" + name
		if b, err = json.Marshal(spec); err == nil {
			err = os.WriteFile(cfg, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		p.IDs = append(p.IDs, id)
		if _, err := p.Runsc(t, bundle, "create", "--bundle", bundle, id); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Runsc(t, "", "start", id); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// SentryPID is the sandbox's sentry, from runsc state.
func (p *RunscPod) SentryPID(t testing.TB) int {
	t.Helper()
	out, err := p.Runsc(t, "", "state", p.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state: %q: %v", out, err)
	}
	return st.Pid
}

// Events runs `runsc events --stats id` and returns its cpu.usage.total
// in ns, and how long the process took, wall and CPU (its user+system).
// runsc before release-20240325 (gVisor 094b83e18, 2024-03-21, "Fix
// CPUUsage() method in cgroup v2 version") took cgroup v2's cpu.stat
// usage_usec for ns: on a v2 host its figure is in microseconds, and
// Events multiplies it by 1000 (runscV2Usec).
func (p *RunscPod) Events(t testing.TB, id string) (cpuNs uint64, wall, cpu time.Duration) {
	t.Helper()
	cmd := exec.Command(p.Bin, "--root", p.Root, "--network=none", "--platform=ptrace", "events", "--stats", id)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("runsc events --stats %s: %v: %s", id, err, stderr.String())
	}
	wall = time.Since(start)
	var ev struct {
		Data struct {
			CPU struct {
				Usage struct {
					Total uint64 `json:"total"`
				} `json:"usage"`
			} `json:"cpu"`
		} `json:"data"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &ev); err != nil {
		t.Fatalf("runsc events --stats %s: %q: %v", id, stdout.String(), err)
	}
	total := ev.Data.CPU.Usage.Total
	if p.runscV2Usec(t) {
		total *= 1000
	}
	return total, wall, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// runscV2Usec reports whether this runsc's events give a cgroup v2 host's
// CPU in microseconds: the host is v2 (CgroupV2) and `runsc --version`
// names a release before 20240325.
func (p *RunscPod) runscV2Usec(t testing.TB) bool {
	if !CgroupV2() {
		return false
	}
	out, err := exec.Command(p.Bin, "--version").Output()
	if err != nil {
		t.Fatalf("runsc --version: %v", err)
	}
	// "runsc version release-20221219.0" upstream, "0.0~20221219.0" in Debian.
	m := regexp.MustCompile(`(?:release-|~)(\d{8})`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("runsc --version: no release date in %q", out)
	}
	return string(m[1]) < "20240325"
}

// Remove kills and deletes one container of the pod (not the sandbox's).
func (p *RunscPod) Remove(t testing.TB, id string) {
	t.Helper()
	p.Runsc(t, "", "kill", id, "KILL")
	if _, err := p.Runsc(t, "", "delete", "-force", id); err != nil {
		t.Fatal(err)
	}
	p.IDs = slices.DeleteFunc(p.IDs, func(s string) bool { return s == id })
}

func (p *RunscPod) cleanup(t testing.TB) {
	// The containers first, each killed then deleted, the sandbox last:
	// killing the sandbox's own container ends the sentry, and runsc can
	// no longer delete the others through it.
	for _, id := range slices.Backward(p.IDs) {
		p.Runsc(t, "", "kill", id, "KILL")
		if _, err := p.Runsc(t, "", "delete", "-force", id); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
	hier, _ := filepath.Glob(filepath.Join(CgroupRoot, "*"))
	hier = append(hier, CgroupRoot)
	for _, h := range hier {
		parent := filepath.Join(h, p.CgroupParent)
		if _, err := os.Stat(parent); err != nil {
			continue
		}
		kids, _ := os.ReadDir(parent)
		for _, k := range kids {
			if k.IsDir() {
				if err := RmdirRetry(filepath.Join(parent, k.Name())); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		if err := RmdirRetry(parent); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// RunscBurnEnv, when set to a positive number, is the shell loop
// iterations BurnArgv burns instead of the caller's: the VM lane sets it,
// since under QEMU TCG the loop runs about 20 times slower.
const RunscBurnEnv = "SBS_RUNSC_BURN_ITERATIONS"

// BurnArgv is a container command that burns n iterations of a shell loop
// (busybox sh: about 1 s of CPU per million here), then sleeps. full is
// false when RunscBurnEnv cut n: a test then knows its burn is smaller
// than it asked.
func BurnArgv(n int) (argv []string, iterations int, full bool) {
	full = true
	if v, err := strconv.Atoi(os.Getenv(RunscBurnEnv)); err == nil && v > 0 {
		n, full = v, false
	}
	return []string{"sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do i=$((i+1)); done; exec sleep 100000", n)}, n, full
}

// StartIdleRunscPod starts, for a benchmark, a pod of n idle application
// containers (app1, app2, ...) and waits until its state files are more
// than a second old, as a pod's are for nearly all its life (statsd's
// cache of runsc state files does not trust a younger one). It skips under
// -short and without root, runsc or a static busybox.
func StartIdleRunscPod(b *testing.B, n int) *RunscPod {
	b.Helper()
	if testing.Short() {
		b.Skip("starts a real gVisor pod; not under -short")
	}
	if os.Geteuid() != 0 || BusyboxStatic() == "" {
		b.Skip("needs root, runsc and a static busybox")
	}
	var names []string
	argv := map[string][]string{}
	for i := range n {
		name := fmt.Sprintf("app%d", i+1)
		names = append(names, name)
		argv[name] = []string{"sleep", "100000"}
	}
	p := StartRunscPod(b, names, argv)
	time.Sleep(1100 * time.Millisecond)
	return p
}

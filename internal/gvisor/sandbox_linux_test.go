package gvisor

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sandbox is a real gVisor sandbox started with Debian's runsc
// (--platform=ptrace --network=none) from an OCI bundle whose rootfs is
// busybox-static, in a unique cgroup. Everything it makes is removed by the
// test's cleanup: the sandbox (delete -force), its cgroups (runsc leaves the
// parent in every v1 hierarchy) and the temporary directories.
type sandbox struct {
	id         string
	bin        string // runsc
	runscRoot  string
	bundle     string
	logs       string // directory of the sandbox's and runsc's output files
	cgroupPath string // linux.cgroupsPath, e.g. /sbstest-123-456/pause
	pid        int    // the sentry (runsc-sandbox)
}

// busyboxStatic returns the path of a statically linked busybox, or "".
func busyboxStatic() string {
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

// needRunsc checks the prerequisites of a real sandbox (skip, or fail under
// CI=true) and returns the runsc and busybox paths.
func needRunsc(t testing.TB) (runsc, busybox string) {
	t.Helper()
	need(t, os.Geteuid() == 0, "needs root for runsc (sudo go test ./internal/gvisor)")
	runsc, err := exec.LookPath("runsc")
	need(t, err == nil, "needs runsc in PATH (apt-get install runsc)")
	busybox = busyboxStatic()
	need(t, busybox != "", "needs a static busybox (apt-get install busybox-static)")
	return runsc, busybox
}

// startSandbox starts a sandbox whose init runs args.
func startSandbox(t testing.TB, args ...string) *sandbox {
	t.Helper()
	runsc, busybox := needRunsc(t)
	uniq := fmt.Sprintf("sbstest-%d-%d", os.Getpid(), time.Now().UnixNano())
	sb := &sandbox{
		id:         uniq,
		bin:        runsc,
		runscRoot:  t.TempDir(),
		bundle:     t.TempDir(),
		logs:       t.TempDir(),
		cgroupPath: "/" + uniq + "/pause",
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
	for _, a := range []string{"sh", "ls", "cat", "dd", "sleep", "echo", "rm", "free", "true"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sb.runsc(t, sb.bundle, append([]string{"spec", "--"}, args...)...); err != nil {
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
	linux["cgroupsPath"] = sb.cgroupPath
	if b, err = json.MarshalIndent(spec, "", "  "); err == nil {
		err = os.WriteFile(cfgPath, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { sb.cleanup(t) })
	start := time.Now()
	if _, err := sb.runsc(t, sb.bundle, "run", "-detach", sb.id); err != nil {
		t.Fatalf("runsc run: %v (logs in %s)", err, sb.logs)
	}
	out, err := sb.runsc(t, "", "state", sb.id)
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
	sb.pid = st.Pid
	t.Logf("sandbox %s running (%s) in %v: sentry pid %d, cgroupsPath %s", sb.id, st.Status, time.Since(start).Round(time.Millisecond), sb.pid, sb.cgroupPath)
	return sb
}

// runsc runs one runsc command with the sandbox's root and flags. The
// sandbox's and runsc's stdout and stderr go to their own files in sb.logs
// (sharing the test's stdout would corrupt it); stdout is also returned.
func (sb *sandbox) runsc(t testing.TB, dir string, args ...string) ([]byte, error) {
	t.Helper()
	full := append([]string{"--root", sb.runscRoot, "--platform=ptrace", "--network=none"}, args...)
	cmd := exec.Command(sb.bin, full...)
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

// exec runs args inside the sandbox and waits for it.
func (sb *sandbox) exec(t testing.TB, args ...string) {
	t.Helper()
	if _, err := sb.runsc(t, "", append([]string{"exec", sb.id}, args...)...); err != nil {
		t.Fatal(err)
	}
}

// cleanup deletes the sandbox and every cgroup directory runsc made for it.
func (sb *sandbox) cleanup(t testing.TB) {
	if _, err := sb.runsc(t, "", "delete", "-force", sb.id); err != nil {
		t.Logf("cleanup: %v", err)
	}
	parent := filepath.Dir(sb.cgroupPath)
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup") // a unified host
	for _, h := range hier {
		for _, d := range []string{sb.cgroupPath, parent} {
			p := filepath.Join(h, d)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if err := rmdirRetry(p); err != nil {
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

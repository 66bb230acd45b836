package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// The roles of TestHelperCgroupNS, chosen by cgnsRoleEnv.
const (
	cgnsRoleEnv   = "SANDBOXSTATS_TEST_CGNS_ROLE"
	cgnsStatsdEnv = "SANDBOXSTATS_TEST_CGNS_STATSD" // the real statsd the namespace runs
	cgnsLauncher  = "launcher"                      // in the pod's cgroup: starts the namespace
	cgnsInit      = "init"                          // inside it: remounts, moves to /worker, execs statsd
)

// TestHelperCgroupNS is not a test: it is how TestIntegrationWorkerCgroupNamespace
// starts statsd as the upstream worker runs it. The launcher, already moved
// into the pod's cgroup by the wrapper script, starts the init in a new
// cgroup and mount namespace (so the namespace's root is the pod's cgroup)
// and forwards SIGTERM to it; the init mounts cgroup2 anew (showing the
// namespace's view), moves itself and the launcher to /worker, enables the
// controllers for the pod's children and becomes statsd.
func TestHelperCgroupNS(t *testing.T) {
	switch os.Getenv(cgnsRoleEnv) {
	case cgnsLauncher:
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCgroupNS$", "-test.count=1", "--")
		cmd.Args = append(cmd.Args, flagArgs()...)
		cmd.Env = append(os.Environ(), cgnsRoleEnv+"="+cgnsInit)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		// Killed, the launcher takes statsd with it (Pdeathsig is the
		// spawning thread's: keep this goroutine on it).
		runtime.LockOSThread()
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "cgroupns launcher:", err)
			os.Exit(1)
		}
		go func() {
			for s := range sigs {
				_ = cmd.Process.Signal(s)
			}
		}()
		_ = cmd.Wait()
		os.Exit(cmd.ProcessState.ExitCode())
	case cgnsInit:
		if err := cgnsBecomeStatsd(); err != nil {
			fmt.Fprintln(os.Stderr, "cgroupns init:", err)
			os.Exit(1)
		}
	default:
		t.Skip("helper process: how TestIntegrationWorkerCgroupNamespace runs statsd")
	}
}

// flagArgs returns the arguments after "--" (statsd's flags).
func flagArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

func cgnsBecomeStatsd() error {
	const cg = "/sys/fs/cgroup"
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The same cgroup2 superblock cannot be mounted over itself (EBUSY):
	// detach the host's view, then mount the namespace's.
	if err := syscall.Unmount(cg, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", cg, err)
	}
	if err := syscall.Mount("cgroup2", cg, "cgroup2", 0, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := os.Mkdir(filepath.Join(cg, "worker"), 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	for _, pid := range []int{os.Getpid(), os.Getppid()} {
		if err := os.WriteFile(filepath.Join(cg, "worker", "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move %d to /worker: %w", pid, err)
		}
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.subtree_control"), []byte("+memory +cpu +io +pids"), 0o644); err != nil {
		return fmt.Errorf("enable the controllers: %w", err)
	}
	bin := os.Getenv(cgnsStatsdEnv)
	return syscall.Exec(bin, append([]string{bin}, flagArgs()...), os.Environ())
}

// TestIntegrationWorkerCgroupNamespace is the upstream worker's shape on a
// cgroup v2 host (the VM lane): statsd runs in a private cgroup namespace
// whose root is the pod's cgroup (/<pod> on the host), in its /worker leaf,
// with cgroup2 mounted inside; a gVisor sandbox runs at the namespace's
// /pause (/<pod>/pause on the host). Bound by --cgroup-path /pause and by
// sentry pid, statsd reads that cgroup: the same numbers as the host's view
// of it (its files read by the test around each sample). A sentry whose
// cgroup is outside the namespace (a child in /<other>) is refused, never
// read, and so is a path with "..".
func TestIntegrationWorkerCgroupNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox and statsd; not under -short")
	}
	testenv.Need(t, os.Geteuid() == 0, "needs root for cgroups and namespaces")
	const root = "/sys/fs/cgroup"
	if !testenv.CgroupV2() {
		// A v1 or hybrid host has no worker shape to test: the VM lane
		// (e2e/vmlane) runs this on a v2 kernel.
		t.Skip("needs a cgroup v2 host (the VM lane runs it)")
	}
	pod := fmt.Sprintf("sbstest-pod-%d-%d", os.Getpid(), time.Now().UnixNano())
	podDir := filepath.Join(root, pod)
	if err := os.Mkdir(podDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{filepath.Join(podDir, "worker"), podDir} {
			if err := testenv.RmdirRetry(d); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	bin := testenv.BuildBinaries(t)
	// The wrapper BuildBinaries' statsd is replaced by: it joins the pod's
	// cgroup and runs the launcher.
	wrapDir := t.TempDir()
	for _, c := range []string{"statsctl"} {
		if err := os.Symlink(filepath.Join(bin, c), filepath.Join(wrapDir, c)); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s/cgroup.procs || exit 1\nexport %s=%s %s=%s\nexec %s -test.run='^TestHelperCgroupNS$' -test.count=1 -- \"$@\"\n",
		podDir, cgnsRoleEnv, cgnsLauncher, cgnsStatsdEnv, filepath.Join(bin, "statsd"), self)
	if err := os.WriteFile(filepath.Join(wrapDir, "statsd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartStatsd(t, wrapDir)
	// statsd is in /<pod>/worker, seen from inside as /worker.
	waitFor(t, 10*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(podDir, "worker", "cgroup.procs"))
		return strings.Count(string(b), "\n") >= 2
	}, "statsd and its launcher in /<pod>/worker")
	if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(d.Cmd.Process.Pid), "task", strconv.Itoa(d.Cmd.Process.Pid), "children")); err == nil {
		if kid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", kid))
			t.Logf("statsd (pid %d) sees itself in %q; the host sees /%s/worker", kid, strings.TrimSpace(string(cg)), pod)
		}
	}

	sb := testenv.StartSandbox(t, "/"+pod+"/pause", "/bin/sh", "-c", "while true; do sleep 1; done")
	sbDir := filepath.Join(root, pod, "pause")
	sb.Exec(t, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=64")

	type figures struct{ current, peak, cpu uint64 }
	host := func() figures {
		t.Helper()
		return figures{current: testenv.CgroupUint(t, sbDir, "memory.current", ""), peak: testenv.CgroupUint(t, sbDir, "memory.peak", ""), cpu: testenv.CgroupUint(t, sbDir, "cpu.stat", "usage_usec")}
	}
	for _, bind := range []struct {
		name string
		args []string
	}{
		{"by cgroup path /pause", []string{"--cgroup-path", "/pause"}},
		{"by sentry pid", []string{"--sentry-pid", strconv.Itoa(sb.PID)}},
	} {
		actor := "cgns-" + strings.ReplaceAll(bind.name, " ", "-")
		actor = strings.ReplaceAll(actor, "/", "")
		statsctl(t, bin, append([]string{"run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--class", "gvisor"}, bind.args...)...)
		before := host()
		var w wireSample
		if err := json.Unmarshal(statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", actor, "-o", "json"), &w); err != nil {
			t.Fatal(err)
		}
		after := host()
		t.Logf("%s: statsd current %s, peak %s, cpu %s us (%s); host's view current %d..%d, peak %d..%d, cpu %d..%d us",
			bind.name, w.MemoryCurrent, w.MemoryPeak, w.CPUUsageUsec, w.SourceDetail, before.current, after.current, before.peak, after.peak, before.cpu, after.cpu)
		// The counters only rise: statsd's lies between the host's reads.
		// The sentry's memory moves both ways meanwhile: within 1 MiB.
		between := func(what string, got int64, lo, hi, slack uint64) {
			if uint64(got)+slack < min(lo, hi) || uint64(got) > max(lo, hi)+slack {
				t.Errorf("%s: %s %d, the host's view of /%s/pause read around it %d..%d (slack %d)", bind.name, what, got, pod, lo, hi, slack)
			}
		}
		between("memory current", w.num(t, w.MemoryCurrent), before.current, after.current, 1<<20)
		between("memory peak", w.num(t, w.MemoryPeak), before.peak, after.peak, 0)
		between("cpu usage", w.num(t, w.CPUUsageUsec), before.cpu, after.cpu, 0)
		if !strings.Contains(w.SourceDetail, "/sys/fs/cgroup/pause") || strings.Contains(w.SourceDetail, pod) {
			t.Errorf("%s: source detail %q, want the namespace's /pause", bind.name, w.SourceDetail)
		}
		if ck := string(statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor)); !strings.Contains(ck, "checkpointed") {
			t.Errorf("%s: checkpoint:\n%s", bind.name, ck)
		}
	}

	// A process whose cgroup is outside the namespace: its /proc/<pid>/cgroup
	// reads "0::/../<other>" inside, and statsd refuses to read it.
	other := filepath.Join(root, fmt.Sprintf("sbstest-other-%d-%d", os.Getpid(), time.Now().UnixNano()))
	testenv.MakeCgroup(t, other)
	c := testenv.StartChild(t, "TestWorkloadChild")
	testenv.JoinCgroup(t, c.Cmd.Process.Pid, other)
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "cgns-outside", "--class", "gvisor", "--sentry-pid", strconv.Itoa(c.Cmd.Process.Pid))
	out, err := exec.Command(filepath.Join(bin, "statsctl"), "stats", "--socket", d.Stats, "--actor-uid", "cgns-outside").CombinedOutput()
	t.Logf("a sentry outside the namespace: %v: %s", err, strings.TrimSpace(string(out)))
	if err == nil || !strings.Contains(string(out), "outside this process's cgroup namespace") {
		t.Errorf("a sentry whose cgroup is outside the namespace was not refused: %v: %s", err, out)
	}
	statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "cgns-outside")
	out, err = exec.Command(filepath.Join(bin, "statsctl"), "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "cgns-dotdot",
		"--class", "gvisor", "--cgroup-path", "/../"+filepath.Base(other)).CombinedOutput()
	t.Logf("a cgroup path that leaves the namespace: %v: %s", err, strings.TrimSpace(string(out)))
	if err == nil || !strings.Contains(string(out), "INVALID_ARGUMENT") {
		t.Errorf("a cgroup path with \"..\" was accepted: %s", out)
	}
}

// waitFor polls cond every 20 ms for up to d, failing the test with what.
func waitFor(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// Environment of the helper TestHelperOutsideNamespace.
const (
	nsStageEnv   = "SANDBOXSTATS_NS_STAGE" // "enter", then "measure"
	nsCgroupsEnv = "SANDBOXSTATS_NS_CGROUPS"
	nsSentryEnv  = "SANDBOXSTATS_NS_SENTRY"
)

// nsReport is what the helper prints on its SBSNS line.
type nsReport struct {
	OwnCgroup, SentryCgroup, Mountinfo string
	Pid                                int // in its own pid namespace
	Took                               time.Duration
	Err                                string
	Reading                            source.Reading
}

// TestIntegrationSentryOutsideCgroupNamespace is statsd as the DaemonSet
// runs it on a node where containerd gives each container a private cgroup
// namespace: the source runs in a process that moved into a cgroup of its
// own (two levels below the root) and started it in new cgroup and pid
// namespaces there (cgroup.procs then lists it by its pid there, 1),
// with the host's cgroup file system as it was mounted (mountinfo shows it
// rooted at "/../.."), and binds a real runsc sandbox outside the namespace
// by its sentry's pid ("/proc/<pid>/cgroup" reads "/../../<sandbox>"). It
// must read the sandbox's own cgroup: memory and CPU as the host's files say
// (the sandbox idles, so between a read before and one after). On the host
// (a hybrid v1 tree) this holds for every v1 hierarchy; in the VM lane for
// cgroup v2.
func TestIntegrationSentryOutsideCgroupNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox; not under -short")
	}
	sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
	name := fmt.Sprintf("sbstest-ns-%d-%d", os.Getpid(), time.Now().UnixNano())
	var hier []string // the hierarchies statsd's cgroup is made in
	memDir, memFile, cpuDir, cpuFile, cpuKey, cpuDiv := "", "memory.usage_in_bytes", "", "cpuacct.usage", "", uint64(1000)
	if testenv.CgroupV2() {
		hier = []string{testenv.CgroupRoot}
		memDir, memFile = testenv.CgroupRoot, "memory.current"
		cpuDir, cpuFile, cpuKey, cpuDiv = testenv.CgroupRoot, "cpu.stat", "usage_usec", 1
	} else {
		seen := map[string]bool{}
		for _, h := range []string{"memory", "cpuacct", "cpu", "pids", "blkio", "unified"} {
			d, err := filepath.EvalSymlinks(filepath.Join(testenv.CgroupRoot, h))
			if err != nil || seen[d] {
				continue
			}
			seen[d] = true
			hier = append(hier, d)
		}
		memDir, cpuDir = filepath.Join(testenv.CgroupRoot, "memory"), filepath.Join(testenv.CgroupRoot, "cpuacct")
	}
	var parents, dirs []string
	for _, h := range hier {
		parents, dirs = append(parents, filepath.Join(h, name)), append(dirs, filepath.Join(h, name, "statsd"))
	}
	testenv.MakeCgroup(t, parents...)
	testenv.MakeCgroup(t, dirs...)

	host := func() (mem, cpu uint64) {
		return testenv.CgroupUint(t, filepath.Join(memDir, sb.CgroupPath), memFile, ""),
			testenv.CgroupUint(t, filepath.Join(cpuDir, sb.CgroupPath), cpuFile, cpuKey) / cpuDiv
	}
	mem0, cpu0 := host()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOutsideNamespace$", "-test.count=1")
	cmd.Env = append(os.Environ(), nsStageEnv+"=enter", nsCgroupsEnv+"="+strings.Join(dirs, ":"), nsSentryEnv+"="+strconv.Itoa(sb.PID))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	mem1, cpu1 := host()
	if err != nil {
		t.Fatalf("helper: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	var rep nsReport
	for line := range strings.SplitSeq(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "SBSNS "); ok {
			if err := json.Unmarshal([]byte(j), &rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("helper (moved, started in new cgroup and pid namespaces, open, sample) took %v; open and sample %v; its /proc/self/cgroup:\n%s\nthe sentry's as it sees it:\n%s\nits cgroup mounts:\n%s\nstderr:\n%s",
		took.Round(time.Millisecond), rep.Took, rep.OwnCgroup, rep.SentryCgroup, rep.Mountinfo, stderr.String())
	if rep.Err != "" {
		t.Fatalf("the source in the private namespace: %s", rep.Err)
	}
	// The namespaces are really private and the host's mount outside them.
	if rep.Pid != 1 {
		t.Errorf("the helper is pid %d in its pid namespace, want 1 (a pid namespace of its own)", rep.Pid)
	}
	if !strings.Contains(rep.SentryCgroup, ":/../..") || !strings.Contains(rep.Mountinfo, " /../.. ") {
		t.Errorf("the sentry's cgroup and the cgroup mount do not show \"/../..\": the helper is not in a private cgroup namespace two levels down")
	}
	r := rep.Reading
	t.Logf("reading: %s; host: memory %d..%d, cpu %d..%d us", fmtReading(r), mem0, mem1, cpu0, cpu1)
	if !strings.Contains(r.Detail, sb.CgroupPath) {
		t.Errorf("detail %q does not name the sandbox's cgroup %s", r.Detail, sb.CgroupPath)
	}
	const slack = 2 << 20 // the idle sandbox's memory moves a little between the reads
	if lo, hi := min(mem0, mem1), max(mem0, mem1); r.MemoryCurrentBytes+slack < lo || r.MemoryCurrentBytes > hi+slack {
		t.Errorf("memory %d, the host's file read %d before and %d after", r.MemoryCurrentBytes, mem0, mem1)
	}
	// The sandbox's processes are all outside the helper's pid namespace:
	// v2 lists them as 0 (counted), v1 leaves them out (absent, never 0,
	// which would say the sandbox is dead).
	if testenv.CgroupV2() {
		if r.SandboxProcesses == nil || *r.SandboxProcesses < 2 {
			t.Errorf("sandbox processes %v, want the sentry, the gofer and more (listed as 0 from the pid namespace)", r.SandboxProcesses)
		}
	} else if r.SandboxProcesses != nil || !slices.ContainsFunc(r.Absent, func(a source.Absent) bool { return a.Field == "sandbox_processes" }) {
		t.Errorf("sandbox processes %v, absent %v; want absent with the reason (v1 lists no process outside the pid namespace)", r.SandboxProcesses, r.Absent)
	}
	if r.CPUUsageUsec == nil || *r.CPUUsageUsec < cpu0 || *r.CPUUsageUsec > cpu1 {
		t.Errorf("cpu %v us, the host's file read %d before and %d after", r.CPUUsageUsec, cpu0, cpu1)
	}
}

// TestHelperOutsideNamespace is not a test: it is the process
// TestIntegrationSentryOutsideCgroupNamespace starts. Stage "enter" moves
// into the cgroups it is given and starts itself again in new cgroup and pid
// namespaces; stage "measure" opens the source by sentry pid with the
// default roots and prints one SBSNS line.
func TestHelperOutsideNamespace(t *testing.T) {
	switch os.Getenv(nsStageEnv) {
	case "enter":
		for _, d := range strings.Split(os.Getenv(nsCgroupsEnv), ":") {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// As containerd starts a container: a cgroup namespace rooted at this
		// cgroup and a pid namespace of its own (the host's /proc stays
		// mounted, as the DaemonSet's /host/proc).
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, nsStageEnv+"=") }), nsStageEnv+"=measure")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWPID}
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		os.Exit(0)
	case "measure":
	default:
		t.Skip("helper process of TestIntegrationSentryOutsideCgroupNamespace")
	}
	pid, _ := strconv.Atoi(os.Getenv(nsSentryEnv))
	rep := nsReport{Pid: os.Getpid()}
	own, _ := os.ReadFile("/proc/self/cgroup")
	sentry, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var cg []string
	for line := range strings.SplitSeq(string(mi), "\n") {
		if strings.Contains(line, " - cgroup") {
			cg = append(cg, line)
		}
	}
	rep.OwnCgroup, rep.SentryCgroup, rep.Mountinfo = string(own), string(sentry), strings.Join(cg, "\n")
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: pid}, Config{Logger: log})
	if err == nil {
		rep.Reading, err = s.Sample(context.Background())
		s.Close()
	}
	rep.Took = time.Since(start).Round(time.Millisecond)
	if err != nil {
		rep.Err = err.Error()
	}
	b, _ := json.Marshal(rep)
	fmt.Printf("SBSNS %s\n", b)
	os.Exit(0)
}

package testenv

import (
	"bufio"
	"crypto/rand"
	"errors"
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
)

// WorkerPod is a worker pod's cgroup as upstream's multi-actor worker lays
// it out: the pod cgroup /<Name>, the root of the worker's private cgroup
// namespace; inside it the worker's own processes in the leaf /worker and
// each hosted actor's runsc sandbox in the leaf /<actorUID>-_pause
// (PauseLeaf; the sandbox's linux.cgroupsPath is "/"+leaf inside the
// namespace, SandboxPath on the host). On a cgroup v2 host the pod is one
// cgroup whose subtree_control the worker fills; on a v1 or hybrid host it
// is made in each hierarchy a gVisor source reads (memory, cpuacct, cpu,
// pids, blkio and the hybrid host's unified mount), and the worker remounts
// those hierarchies inside its namespace.
type WorkerPod struct {
	Name string // the pod cgroup, relative to each hierarchy's root
	// HostView, when set (an empty directory), is where the worker's mount
	// namespace also holds the host's cgroup mounts (CgroupRoot, bound
	// before the worker mounts its own): what a worker whose cgroup file
	// system was not mounted in its namespace reads.
	HostView string
	hiers    []string // the hierarchies the worker joins, relative to CgroupRoot ("." on v2)
}

// The roles of RunWorkerPod, chosen by workerPodRoleEnv.
const (
	workerPodRoleEnv  = "SANDBOXSTATS_TEST_WORKERPOD_ROLE"
	workerPodNameEnv  = "SANDBOXSTATS_TEST_WORKERPOD_NAME"
	workerPodHiersEnv = "SANDBOXSTATS_TEST_WORKERPOD_HIERS" // comma-separated
	workerPodViewEnv  = "SANDBOXSTATS_TEST_WORKERPOD_HOSTVIEW"
	workerPodLauncher = "launcher" // joins the pod, starts the namespace's init
	workerPodInit     = "init"     // inside it: remounts, moves to /worker, execs the worker
)

// PauseLeaf is upstream's leaf of an actor's sandbox in the worker's
// namespace (ocispec.GVisorCgroupLeaf(uid, PauseContainer)).
func PauseLeaf(actorUID string) string { return actorUID + "-_pause" }

// NewActorUID returns a random version 4 UUID, the shape of the Kubernetes
// object uid upstream names an actor by.
func NewActorUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// MakeWorkerPod makes a fresh pod cgroup (see WorkerPod). Its cleanup, which
// runs after the sandboxes' and the worker's when they are started later,
// removes /worker and the pod in every hierarchy (runsc makes the pod in
// every v1 hierarchy for its sandboxes).
func MakeWorkerPod(t testing.TB) *WorkerPod {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root for cgroups and namespaces")
	p := &WorkerPod{Name: fmt.Sprintf("sbstest-pod-%d-%d", os.Getpid(), time.Now().UnixNano())}
	if CgroupV2() {
		p.hiers = []string{"."}
	} else {
		for _, h := range []string{"memory", "cpuacct", "cpu", "pids", "blkio"} {
			if _, err := os.Stat(filepath.Join(CgroupRoot, h)); err == nil {
				p.hiers = append(p.hiers, h)
			}
		}
		if v2, err := cgroup2At(filepath.Join(CgroupRoot, "unified")); err == nil && v2 {
			p.hiers = append(p.hiers, "unified")
		}
		Need(t, len(p.hiers) > 0 && p.hiers[0] == "memory", "needs the v1 memory hierarchy at "+CgroupRoot+"/memory")
	}
	for _, h := range p.hiers {
		if err := os.Mkdir(filepath.Join(CgroupRoot, h, p.Name), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		hiers, _ := filepath.Glob(filepath.Join(CgroupRoot, "*"))
		for _, h := range append(hiers, CgroupRoot) {
			for _, d := range []string{filepath.Join(h, p.Name, "worker"), filepath.Join(h, p.Name)} {
				if _, err := os.Stat(d); err != nil {
					continue
				}
				if err := RmdirRetry(d); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
	return p
}

// SandboxPath is the cgroupsPath, as the host sees it, of the actor's
// sandbox: /<pod>/<actorUID>-_pause (the worker sees /<actorUID>-_pause).
func (p *WorkerPod) SandboxPath(actorUID string) string {
	return "/" + p.Name + "/" + PauseLeaf(actorUID)
}

// Dir is the host's directory of leaf ("" for the pod itself) in the
// hierarchy the test reads ctl's files from: CgroupRoot/<pod>/<leaf> on v2,
// CgroupRoot/<ctl>/<pod>/<leaf> on v1 ("memory", "cpuacct").
func (p *WorkerPod) Dir(ctl, leaf string) string {
	if p.hiers[0] == "." {
		ctl = ""
	}
	return filepath.Join(CgroupRoot, ctl, p.Name, leaf)
}

// LeafFigures are a leaf's figures as its kernel files say them, read from
// the host: v2 memory.current, memory.peak and cpu.stat usage_usec; v1
// memory.usage_in_bytes, memory.max_usage_in_bytes and cpuacct.usage (ns,
// shown in µs as statsd does).
type LeafFigures struct{ Current, Peak, CPUUsec uint64 }

// Figures reads leaf's LeafFigures.
func (p *WorkerPod) Figures(t testing.TB, leaf string) LeafFigures {
	t.Helper()
	if p.hiers[0] == "." {
		dir := p.Dir("", leaf)
		return LeafFigures{
			Current: CgroupUint(t, dir, "memory.current", ""),
			Peak:    CgroupUint(t, dir, "memory.peak", ""),
			CPUUsec: CgroupUint(t, dir, "cpu.stat", "usage_usec"),
		}
	}
	mem := p.Dir("memory", leaf)
	return LeafFigures{
		Current: CgroupUint(t, mem, "memory.usage_in_bytes", ""),
		Peak:    CgroupUint(t, mem, "memory.max_usage_in_bytes", ""),
		CPUUsec: CgroupUint(t, p.Dir("cpuacct", leaf), "cpuacct.usage", "") / 1000,
	}
}

// Command returns a command that runs args (args[0] a path) as the pod's
// worker: helper is the name of the test binary's helper test whose body is
// RunWorkerPod. It joins the pod, starts a process in a new cgroup and mount
// namespace (whose cgroup root is then the pod), which mounts the cgroup
// hierarchies anew (the namespace's view), moves itself and the first process
// to /worker, on v2 enables the controllers the pod offers (memory, cpu,
// io, pids) for its children, and execs args. Killed, the first process
// takes the worker with it; SIGTERM and SIGINT are passed on.
func (p *WorkerPod) Command(helper string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^" + helper + "$", "-test.count=1", "--"}, args...)...)
	cmd.Env = append(os.Environ(), p.env()...)
	return cmd
}

// env is what the launcher is told: its role and the pod.
func (p *WorkerPod) env() []string {
	return []string{workerPodRoleEnv + "=" + workerPodLauncher, workerPodNameEnv + "=" + p.Name,
		workerPodHiersEnv + "=" + strings.Join(p.hiers, ","), workerPodViewEnv + "=" + p.HostView}
}

// StartChild starts the test binary's helper test childHelper (whose body is
// RunChild or answers like it) as the pod's worker (Command, through the
// helper test podHelper), talking to it as StartChild does.
func (p *WorkerPod) StartChild(t testing.TB, podHelper, childHelper string) *Child {
	t.Helper()
	cmd := p.Command(podHelper, os.Args[0], "-test.run=^"+childHelper+"$", "-test.count=1")
	cmd.Env = append(cmd.Env, childEnv+"=1")
	return startChild(t, cmd)
}

// WrapStatsd returns a directory holding binDir's statsctl and a statsd that
// runs binDir's statsd as the pod's worker (Command, through the helper test
// helper), for StartStatsd.
func (p *WorkerPod) WrapStatsd(t testing.TB, binDir, helper string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(binDir, "statsctl"), filepath.Join(dir, "statsctl")); err != nil {
		t.Fatal(err)
	}
	cmd := p.Command(helper, filepath.Join(binDir, "statsd"))
	var script strings.Builder
	script.WriteString("#!/bin/sh\n")
	for _, e := range p.env() {
		fmt.Fprintf(&script, "export %s\n", shellQuote(e))
	}
	script.WriteString("exec")
	for _, a := range cmd.Args {
		script.WriteString(" " + shellQuote(a))
	}
	script.WriteString(" \"$@\"\n")
	if err := os.WriteFile(filepath.Join(dir, "statsd"), []byte(script.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// RunWorkerPod is the body of a package's helper "test" that
// WorkerPod.Command runs, e.g.
//
//	func TestHelperWorkerPod(t *testing.T) { testenv.RunWorkerPod(t) }
//
// Run normally it skips. Its roles end the process: the launcher exits as
// the worker does, the init becomes the worker; either returns only to
// report why it could not.
func RunWorkerPod(t *testing.T) {
	var err error
	switch os.Getenv(workerPodRoleEnv) {
	case workerPodLauncher:
		err = workerPodLaunch()
	case workerPodInit:
		err = workerPodBecomeWorker()
	default:
		t.Skip("helper process: how testenv.WorkerPod runs a worker")
	}
	fmt.Fprintf(os.Stderr, "worker pod %s: %v\n", os.Getenv(workerPodRoleEnv), err)
	os.Exit(1)
}

// workerArgs returns the arguments after "--" (the worker's command).
func workerArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

func workerPodHiers() []string { return strings.Split(os.Getenv(workerPodHiersEnv), ",") }

// workerPodLaunch joins the pod in every hierarchy, then starts the init in
// a new cgroup namespace (rooted at the pod) and mount namespace, passes
// SIGTERM and SIGINT on and exits as it does.
func workerPodLaunch() error {
	pod := os.Getenv(workerPodNameEnv)
	for _, h := range workerPodHiers() {
		p := filepath.Join(CgroupRoot, h, pod, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return fmt.Errorf("join %s: %w", p, err)
		}
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), workerPodRoleEnv+"="+workerPodInit)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Pdeathsig is the spawning thread's: keep this goroutine on it.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	_ = cmd.Wait()
	os.Exit(cmd.ProcessState.ExitCode())
	return nil
}

// workerPodBecomeWorker mounts the namespace's view of the hierarchies over
// CgroupRoot (the host's bound on HostView first, if set), moves this
// process and its parent to /worker, enables the pod's controllers on v2 and
// execs the worker.
func workerPodBecomeWorker() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if v := os.Getenv(workerPodViewEnv); v != "" {
		if err := syscall.Mount(CgroupRoot, v, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind the host's %s on %s: %w", CgroupRoot, v, err)
		}
	}
	hiers := workerPodHiers()
	if hiers[0] == "." {
		// The same cgroup2 superblock cannot be mounted over itself
		// (EBUSY): detach the host's view, then mount the namespace's.
		if err := syscall.Unmount(CgroupRoot, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", CgroupRoot, err)
		}
		if err := syscall.Mount("cgroup2", CgroupRoot, "cgroup2", 0, ""); err != nil {
			return fmt.Errorf("mount cgroup2: %w", err)
		}
	} else if err := remountV1(hiers); err != nil {
		return err
	}
	for _, h := range hiers {
		w := filepath.Join(CgroupRoot, h, "worker")
		if err := os.Mkdir(w, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		for _, pid := range []int{os.Getpid(), os.Getppid()} {
			if err := os.WriteFile(filepath.Join(w, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
				return fmt.Errorf("move %d to %s: %w", pid, w, err)
			}
		}
	}
	if hiers[0] == "." {
		b, err := os.ReadFile(filepath.Join(CgroupRoot, "cgroup.controllers"))
		if err != nil {
			return err
		}
		var enable []string
		for c := range strings.FieldsSeq(string(b)) {
			if c == "memory" || c == "cpu" || c == "io" || c == "pids" {
				enable = append(enable, "+"+c)
			}
		}
		if err := os.WriteFile(filepath.Join(CgroupRoot, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("enable %v: %w", enable, err)
		}
	}
	args := workerArgs()
	if len(args) == 0 {
		return errors.New("no worker command after --")
	}
	return syscall.Exec(args[0], args, os.Environ())
}

// remountV1 puts a tmpfs over CgroupRoot and mounts each v1 hierarchy (with
// the controllers the host mounted it with) and the unified one anew: in a
// cgroup namespace a cgroup mount's root is the namespace's cgroup.
func remountV1(hiers []string) error {
	opts, err := v1MountOptions()
	if err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", CgroupRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", CgroupRoot, err)
	}
	for _, h := range hiers {
		dir := filepath.Join(CgroupRoot, h)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		fstype, data := "cgroup", opts[h]
		if h == "unified" {
			fstype, data = "cgroup2", ""
		} else if data == "" {
			return fmt.Errorf("no v1 mount of %s in /proc/self/mountinfo", h)
		}
		if err := syscall.Mount("cgroup", dir, fstype, 0, data); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", fstype, data, dir, err)
		}
	}
	return nil
}

// v1MountOptions maps each v1 hierarchy's name under CgroupRoot (as the
// host mounted it, e.g. "memory", "cpu", or both "cpu" and "cpuacct" for a
// co-mounted "cpu,cpuacct" and its symlinks) to the options that mount it
// again: its controllers and name=.
func v1MountOptions() (map[string]string, error) {
	ctls := map[string]bool{}
	if b, err := os.ReadFile("/proc/cgroups"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
				ctls[f[0]] = true
			}
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	byDir := map[string]string{}
	for s := bufio.NewScanner(f); s.Scan(); {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		var keep []string
		for o := range strings.SplitSeq(qf[2], ",") {
			if ctls[o] || strings.HasPrefix(o, "name=") {
				keep = append(keep, o)
			}
		}
		byDir[pf[4]] = strings.Join(keep, ",")
	}
	opts := map[string]string{}
	entries, err := os.ReadDir(CgroupRoot)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		real, err := filepath.EvalSymlinks(filepath.Join(CgroupRoot, e.Name()))
		if err != nil {
			continue
		}
		if o, ok := byDir[real]; ok {
			opts[e.Name()] = o
		}
	}
	return opts, nil
}

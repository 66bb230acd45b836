package testenv

// What a Containerd leaves behind, ended: pods, processes, mounts, cgroups.

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// cleanup ends everything StartContainerd started. With containerd
// running, each pod is stopped and removed through the CRI first (a runsc
// pod killed under its runtime before); then containerd is stopped, runsc
// and runc delete what is left in their roots, the shims and any other
// process whose command line names Dir are stopped (SIGTERM, then SIGKILL),
// the mounts under Dir are unmounted, the pods' cgroups (killing what is
// still in them) and their empty parents are removed in every hierarchy,
// and Dir is removed. A process or mount left fails the test.
func (c *Containerd) cleanup(t testing.TB) {
	if t.Failed() {
		t.Logf("%s (tail):\n%s", c.Log, c.logTail(8192))
		if b, err := os.ReadFile(c.wrapperLog); err == nil {
			t.Logf("%s:\n%s", c.wrapperLog, b)
		}
	}
	if c.PID() != 0 {
		if pods, err := c.listPods(); err == nil {
			for _, p := range pods {
				if p.RuntimeHandler == "runsc" && p.State == "SANDBOX_READY" {
					c.Runsc("kill", "--all", p.ID, "KILL")
					c.Runsc("delete", "-force", p.ID)
				}
				if _, err := c.crictl(20*time.Second, "stopp", p.ID); err != nil {
					t.Logf("cleanup: %v", err)
				}
				if _, err := c.crictl(20*time.Second, "rmp", "-f", p.ID); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		} else {
			t.Logf("cleanup: %v", err)
		}
	}
	c.stop()

	ids, parents := c.knownIDs()
	for _, rt := range []struct{ bin, root string }{{c.runsc, c.RunscRoot}, {c.Bins.Runc, c.RuncRoot}} {
		for _, id := range runtimeList(rt.root) {
			args := []string{"--root", rt.root, "delete", "--force", id}
			if rt.bin == c.runsc {
				args = append([]string{"--platform=ptrace", "--network=none"}, args...)
			}
			if out, err := c.run(rt.bin, args...); err != nil {
				t.Logf("cleanup: %v %s", err, out)
			}
		}
	}
	c.stopProcesses(t)
	c.unmountAll(t)
	c.removeCgroups(t, ids, parents)
	if pids := processesNaming(c.Dir); len(pids) > 0 {
		t.Errorf("cleanup: processes left naming %s: %v", c.Dir, pids)
	}
	for _, h := range cgroupHierarchies() {
		for _, parent := range parents {
			for _, id := range ids {
				if _, err := os.Stat(filepath.Join(h, parent, id)); err == nil {
					t.Errorf("cleanup: cgroup left: %s", filepath.Join(h, parent, id))
				}
			}
		}
	}
	if m := mountsUnder(c.Dir); len(m) > 0 {
		t.Errorf("cleanup: mounts left under %s: %v", c.Dir, m)
		return // RemoveAll would descend into them
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// knownIDs are the ids of every sandbox and container this containerd may
// have made (RunPod's, the runtime v2 task directories', those in the runc
// and runsc roots, those its logs name) and the cgroup parents they may be
// in (/k8s.io and every PodSpec.CgroupParent).
func (c *Containerd) knownIDs() (ids, parents []string) {
	parents = []string{"/" + criNamespace}
	c.mu.Lock()
	for id, parent := range c.pods {
		ids = append(ids, id)
		parents = append(parents, parent)
	}
	c.mu.Unlock()
	ents, _ := os.ReadDir(filepath.Join(c.State, "io.containerd.runtime.v2.task", criNamespace))
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	ids = append(ids, runtimeList(c.RunscRoot)...)
	ids = append(ids, runtimeList(c.RuncRoot)...)
	// A pod whose start failed is in no list, but runsc may have made its
	// cgroups: its id is in the wrapper's log and containerd's (with image
	// digests, whose cgroups do not exist).
	for _, log := range []string{c.wrapperLog, c.Log} {
		b, _ := os.ReadFile(log)
		for _, id := range hexID.FindAll(b, -1) {
			ids = append(ids, string(id))
		}
	}
	slices.Sort(ids)
	slices.Sort(parents)
	return slices.Compact(ids), slices.Compact(parents)
}

// hexID matches a container id (and a sha256 digest).
var hexID = regexp.MustCompile(`\b[0-9a-f]{64}\b`)

// runtimeList lists the container ids in a runc or runsc root: both keep
// one directory (runc) or <id>_sandbox:<id>.state file (runsc) per
// container there.
func runtimeList(root string) []string {
	ents, _ := os.ReadDir(root)
	var ids []string
	for _, e := range ents {
		name := e.Name()
		switch {
		case e.IsDir():
			ids = append(ids, name)
		case strings.HasSuffix(name, ".state"):
			if _, id, ok := strings.Cut(strings.TrimSuffix(name, ".state"), ":"); ok {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// stopProcesses stops every process whose command line names Dir (the
// shims, by their -address; runsc's sandbox and gofer, by their --root;
// containerd): SIGTERM, and SIGKILL to those left after 5 s.
func (c *Containerd) stopProcesses(t testing.TB) {
	pids := processesNaming(c.Dir)
	if len(pids) == 0 {
		return
	}
	t.Logf("cleanup: stopping processes naming %s: %v", c.Dir, pids)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if pids = processesNaming(c.Dir); len(pids) == 0 {
				return
			}
		}
	}
}

// processesNaming returns the pids of the live processes (not zombies)
// whose command line contains dir.
func processesNaming(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		if st, err := process.ReadStat(filepath.Join("/proc", e.Name())); err == nil && st.State == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// mountsUnder returns the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	return points
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts every mount under Dir (the sandboxes' shm, the
// containers' rootfs), lazily when one is still busy.
func (c *Containerd) unmountAll(t testing.TB) {
	for _, p := range mountsUnder(c.Dir) {
		if err := syscall.Unmount(p, 0); err != nil {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", p, err)
			}
		}
	}
}

// cgroupHierarchies are the cgroup mounts: every v1 hierarchy and the
// unified one of a hybrid host, or CgroupRoot itself on a v2 host.
func cgroupHierarchies() []string {
	if CgroupV2() {
		return []string{CgroupRoot}
	}
	var hier []string
	ents, _ := os.ReadDir(CgroupRoot)
	for _, e := range ents {
		p := filepath.Join(CgroupRoot, e.Name())
		if st, err := os.Lstat(p); err == nil && st.IsDir() { // not the cpu,cpuacct style links
			hier = append(hier, p)
		}
	}
	return hier
}

// removeCgroups removes the cgroup <parent>/<id> of each id and parent in
// every hierarchy, killing what is still in it, then each parent once empty
// (a parent another containerd still uses is left).
func (c *Containerd) removeCgroups(t testing.TB, ids, parents []string) {
	hier := cgroupHierarchies()
	for _, h := range hier {
		for _, parent := range parents {
			for _, id := range ids {
				dir := filepath.Join(h, parent, id)
				if _, err := os.Stat(dir); err != nil {
					continue
				}
				killCgroup(dir)
				if err := rmdirTree(dir); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
			dir := filepath.Join(h, parent)
			if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
				t.Errorf("cleanup: rmdir %s: %v", dir, err)
			}
		}
	}
}

// killCgroup SIGKILLs the processes in the cgroup dir (and its children)
// until it is empty, for up to 5 s.
func killCgroup(dir string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n := 0
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					n++
				}
			}
			return nil
		})
		if n == 0 {
			return
		}
	}
}

// rmdirTree removes the cgroup dir and the cgroups below it, deepest first.
func rmdirTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := RmdirRetry(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

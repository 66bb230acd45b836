package sentryusage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/sentryusage"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// pod is a real gVisor sandbox with containers joined to it by the CRI
// annotations, as containerd's CRI creates a pod under runsc (section 5.5
// of the cgroups-and-gvisor reference): the first bundle is the sandbox
// (container-type sandbox), each next one a container naming it
// (io.kubernetes.cri.sandbox-id).
type pod struct {
	runsc, root, cgroupParent string
	sandboxID                 string
	ids                       []string // the sandbox's first
	logs                      string
}

// runscCmd runs runsc with the pod's root and this host's flags
// (--platform=ptrace: Debian's runsc has no systrap). Its output goes to
// files: the sandbox a create starts inherits them, and a pipe would keep
// Run waiting for the sandbox's end.
func (p *pod) runscCmd(t testing.TB, dir string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(p.runsc, append([]string{"--root", p.root, "--network=none", "--platform=ptrace"}, args...)...)
	cmd.Dir = dir
	name := filepath.Join(p.logs, fmt.Sprintf("%d-%s", time.Now().UnixNano(), args[0]))
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

// startPod starts a sandbox running `sleep` and one container per entry of
// containers (name -> argv), in the order given by names.
func startPod(t *testing.T, names []string, containers map[string][]string) *pod {
	t.Helper()
	runsc, busybox := testenv.NeedRunsc(t)
	tag := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	p := &pod{runsc: runsc, root: t.TempDir(), cgroupParent: "/sbstest-sentry-" + tag, sandboxID: "sbstest-" + tag, logs: t.TempDir()}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cleanup(t) })
	all := append([]string{"pause"}, names...)
	containers["pause"] = []string{"sleep", "100000"}
	for i, name := range all {
		id := p.sandboxID
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
		if _, err := p.runscCmd(t, bundle, append([]string{"spec", "--"}, containers[name]...)...); err != nil {
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
			"io.kubernetes.cri.sandbox-id":     p.sandboxID,
			"io.kubernetes.cri.container-name": name,
		}
		spec["linux"].(map[string]any)["cgroupsPath"] = p.cgroupParent + "/" + name
		if b, err = json.Marshal(spec); err == nil {
			err = os.WriteFile(cfg, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		p.ids = append(p.ids, id)
		if _, err := p.runscCmd(t, bundle, "create", "--bundle", bundle, id); err != nil {
			t.Fatal(err)
		}
		if _, err := p.runscCmd(t, "", "start", id); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// sentryPID is the sandbox's sentry, from runsc state.
func (p *pod) sentryPID(t testing.TB) int {
	t.Helper()
	out, err := p.runscCmd(t, "", "state", p.sandboxID)
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

// events runs `runsc events --stats id` and returns its cpu.usage.total
// (ns), and how long the process took, wall and CPU (its user+system).
func (p *pod) events(t testing.TB, id string) (cpuNs uint64, wall, cpu time.Duration) {
	t.Helper()
	cmd := exec.Command(p.runsc, "--root", p.root, "--network=none", "--platform=ptrace", "events", "--stats", id)
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
	return ev.Data.CPU.Usage.Total, wall, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

func (p *pod) cleanup(t testing.TB) {
	// The containers first, each killed then deleted, the sandbox last:
	// killing the sandbox's own container ends the sentry, and runsc can
	// no longer delete the others through it.
	for _, id := range slices.Backward(p.ids) {
		p.runscCmd(t, "", "kill", id, "KILL")
		if _, err := p.runscCmd(t, "", "delete", "-force", id); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
	hier, _ := filepath.Glob(filepath.Join(testenv.CgroupRoot, "*"))
	hier = append(hier, testenv.CgroupRoot)
	for _, h := range hier {
		parent := filepath.Join(h, p.cgroupParent)
		if _, err := os.Stat(parent); err != nil {
			continue
		}
		kids, _ := os.ReadDir(parent)
		for _, k := range kids {
			if k.IsDir() {
				if err := testenv.RmdirRetry(filepath.Join(parent, k.Name())); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		if err := testenv.RmdirRetry(parent); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// hostCPU is the host cgroup CPU of pid in ns, as runsc's populateStats
// reads it (cgroup.NewFromPid): v1 cpuacct.usage, v2 cpu.stat usage_usec x
// 1000.
func hostCPU(t testing.TB, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if slices.Contains(strings.Split(f[1], ","), "cpuacct") {
			for _, dir := range []string{f[1], "cpuacct", "cpu,cpuacct"} {
				v, err := os.ReadFile(filepath.Join(testenv.CgroupRoot, dir, f[2], "cpuacct.usage"))
				if err == nil {
					n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					return n
				}
			}
		}
		if f[0] == "0" && f[1] == "" {
			if st, err := os.ReadFile(filepath.Join(testenv.CgroupRoot, f[2], "cpu.stat")); err == nil {
				for _, l := range strings.Split(string(st), "\n") {
					if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
						n, err := strconv.ParseUint(v, 10, 64)
						if err != nil {
							t.Fatal(err)
						}
						return n * 1000
					}
				}
			}
		}
	}
	t.Fatalf("no CPU counter for pid %d in %q", pid, b)
	return 0
}

// TestIntegrationSentryTwoContainers reads a real sandbox of two containers
// (one burns about 1.5M shell loop iterations then sleeps, one sleeps)
// through the client, and compares each container's CPU with what
// `runsc events --stats` says for it; then it times one Read against one
// runsc events process.
func TestIntegrationSentryTwoContainers(t *testing.T) {
	p := startPod(t, []string{"busy", "idle"}, map[string][]string{
		"busy": {"sh", "-c", "i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done; exec sleep 100000"},
		"idle": {"sleep", "100000"},
	})
	sid, busy, idle := p.ids[0], p.ids[1], p.ids[2]
	pid := p.sentryPID(t)
	c, err := sentryusage.New(sentryusage.Config{RootDirs: []string{p.root}, Abstract: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q := sentryusage.Query{SandboxID: sid, ContainerID: busy, Containers: p.ids}

	// Wait until the burner is done: its CPU the same in two reads 500ms
	// apart.
	var u sentryusage.Usage
	var last uint64
	deadline := time.Now().Add(90 * time.Second)
	for {
		if u, err = c.Read(ctx, q); err != nil {
			t.Fatal(err)
		}
		if v := u.CPU[busy]; v > 0 && v == last {
			break
		} else {
			last = v
		}
		if time.Now().After(deadline) {
			t.Fatalf("the burner did not finish in 90s: %+v", u)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("Read: socket %s, dialect %v, CPU %v ns, memory %v B (%v), pids %v (sandbox-wide %v), foreign %d",
		u.Socket, u.Dialect, u.CPU, deref(u.MemoryBytes), u.Memory, deref(u.Pids), u.PidsSandboxWide, u.ForeignCount)
	if u.ForeignCount != 0 || u.CPU[busy] == 0 {
		t.Fatalf("CPU %v, %d foreign keys", u.CPU, u.ForeignCount)
	}
	if _, ok := u.CPU[idle]; !ok {
		t.Fatalf("no CPU for the idle container %s: %v", idle, u.CPU)
	}
	if u.Dialect == sentryusage.DialectNoArg && u.Memory != sentryusage.MemorySandboxTotal {
		t.Errorf("memory scope %v on a no-arg runsc", u.Memory)
	}

	// Each container against runsc events: runsc rescales the sentry's
	// figures to the host cgroup's CPU (populateStats), so the client's
	// are rescaled alike, with the host counter read right after each
	// runsc events (the sentry is idle now: the counter barely moves).
	for _, id := range []string{busy, idle} {
		cli, _, _ := p.events(t, id)
		host := hostCPU(t, pid)
		got := sentryusage.ScaleToHost(u.CPU, host)[id]
		diff := math.Abs(float64(got)-float64(cli)) / float64(cli)
		t.Logf("%s: sentry %d ns, scaled to the host cgroup's %d ns: %d ns; runsc events %d ns; %.2f%% apart; sentry/host %.2f",
			id, u.CPU[id], host, got, cli, 100*diff, float64(sum(u.CPU))/float64(host))
		if diff > 0.05 {
			t.Errorf("%s: %d ns from the client (scaled), %d ns from runsc events: %.1f%% apart, want <= 5%%", id, got, cli, 100*diff)
		}
	}

	// Cost: one Read vs one runsc events process (medians).
	var reads, readCPU []time.Duration
	for range 21 {
		cpu0 := selfCPU()
		start := time.Now()
		if _, err := c.Read(ctx, q); err != nil {
			t.Fatal(err)
		}
		reads = append(reads, time.Since(start))
		readCPU = append(readCPU, selfCPU()-cpu0)
	}
	var cliWall, cliCPU []time.Duration
	for range 5 {
		_, w, c := p.events(t, idle)
		cliWall, cliCPU = append(cliWall, w), append(cliCPU, c)
	}
	rw, rc, cw, cc := median(reads), median(readCPU), median(cliWall), median(cliCPU)
	t.Logf("one Read: %v wall, %v CPU in this process; one runsc events --stats: %v wall, %v CPU (its user+system); wall %.1fx, CPU %.1fx cheaper (issue 31 wants >= 20x)",
		rw, rc, cw, cc, float64(cw)/float64(rw), float64(cc)/float64(max(rc, time.Microsecond)))
}

func deref(p *uint64) any {
	if p == nil {
		return "absent"
	}
	return *p
}

func sum(m map[string]uint64) (s uint64) {
	for _, v := range m {
		s += v
	}
	return s
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// selfCPU is this process's user+system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestHelperWorkerPod is not a test: it is how testenv.WorkerPod starts the
// worker of TestIntegrationUpstreamLeafLayout in the pod's private cgroup
// namespace.
func TestHelperWorkerPod(t *testing.T) { testenv.RunWorkerPod(t) }

// TestHelperLeafReader is not a test: it is the worker of
// TestIntegrationUpstreamLeafLayout, inside the pod's cgroup namespace in
// its /worker leaf, opening gVisor sources as statsd would there (the
// default cgroup and proc roots, which show the namespace's view). One
// command per stdin line, one answer line:
//
//	pid                  -> "ok <its pid>"
//	cgroup <pid|self>    -> "ok <that /proc/<pid>/cgroup as it reads here, lines joined by ';'>"
//	sample path <path> [<cgroup root>]  -> "ok <source.Reading as JSON>" or "err <error>"
//	sample pid <pid> [<cgroup root>]    -> the same, the source opened by sentry pid
//
// The cgroup root is /sys/fs/cgroup unless given.
// A source is opened by the first sample of its ref and kept, as statsd
// keeps a binding's.
func TestHelperLeafReader(t *testing.T) {
	if !testenv.InChild() {
		t.Skip("helper process: the worker of TestIntegrationUpstreamLeafLayout")
	}
	srcs := map[string]source.Source{}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 1 && f[0] == "pid":
			fmt.Println("ok", os.Getpid())
		case len(f) == 2 && f[0] == "cgroup":
			b, err := os.ReadFile("/proc/" + f[1] + "/cgroup")
			if err != nil {
				fmt.Println("err", err)
				continue
			}
			fmt.Println("ok", strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", ";"))
		case (len(f) == 3 || len(f) == 4) && f[0] == "sample":
			key, cfg := strings.Join(f[1:], " "), Config{Logger: discard()}
			if len(f) == 4 {
				cfg.CgroupRoot = f[3]
			}
			s := srcs[key]
			if s == nil {
				ref := source.SandboxRef{Class: source.ClassGVisor}
				if f[1] == "path" {
					ref.CgroupPath = f[2]
				} else {
					ref.SentryPID, _ = strconv.Atoi(f[2])
				}
				var err error
				if s, err = Open(ref, cfg); err != nil {
					fmt.Println("err", err)
					continue
				}
				srcs[key] = s
			}
			r, err := s.Sample(context.Background())
			if err != nil {
				fmt.Println("err", err)
				continue
			}
			b, _ := json.Marshal(r)
			fmt.Println("ok", string(b))
		default:
			fmt.Println("unknown command", in.Text())
		}
	}
	os.Exit(0)
}

// TestIntegrationUpstreamLeafLayout is upstream's multi-actor worker on real
// cgroups with real runsc: a pod cgroup whose private cgroup namespace the
// worker runs in, the worker in the pod's /worker leaf and three actors
// (UUID uids) each in a real gVisor sandbox in its own /<uid>-_pause leaf
// (linux.cgroupsPath /<pod>/<uid>-_pause on the host; 32, 64 and 96 MiB
// written to their /dev/shm, so that no two leaves hold the same memory).
// The worker (TestHelperLeafReader) opens a source per actor by the path
// it sees, /<uid>-_pause, and one by the sentry's pid, whose
// /proc/<pid>/cgroup it reads relative to its namespace. On v2 the
// namespace's cgroup2 mount is the pod; on a v1 or hybrid host each
// hierarchy (memory, cpuacct, cpu, pids, blkio, unified) is mounted anew in
// it. Every sample, read between two reads of the leaf's own kernel files
// from the host, equals them (current within 1 MiB, the sentry's memory
// moving meanwhile; peak and CPU between the two reads) and is far from
// every sibling leaf's memory; its detail names the leaf as the worker sees
// it, never the pod. The host's path of a leaf does not exist in the
// worker's view.
func TestIntegrationUpstreamLeafLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three real gVisor sandboxes; not under -short")
	}
	testenv.NeedRunsc(t)
	pod := testenv.MakeWorkerPod(t)
	pod.HostView = t.TempDir()
	worker := pod.StartChild(t, "TestHelperWorkerPod", "TestHelperLeafReader")
	ask := func(cmd string) string {
		t.Helper()
		return strings.TrimPrefix(worker.Do(t, cmd), "ok ")
	}
	wpid := ask("pid")
	inside := ask("cgroup self")
	outside, err := os.ReadFile("/proc/" + wpid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the worker (pid %s) sees itself in %q; the host sees %q", wpid, inside, strings.ReplaceAll(strings.TrimSpace(string(outside)), "\n", ";"))
	wantLine := "0::/worker"
	if !testenv.CgroupV2() {
		wantLine = ":memory:/worker"
	}
	if !strings.Contains(inside+";", wantLine+";") {
		t.Fatalf("the worker's own cgroup %q has no %q: not in the pod's namespace's /worker leaf", inside, wantLine)
	}

	type actor struct {
		uid, leaf string
		sb        *testenv.Sandbox
	}
	var actors []actor
	for i := range 3 {
		uid := testenv.NewActorUID()
		sb := testenv.StartSandbox(t, pod.SandboxPath(uid), "/bin/sh", "-c", "while true; do sleep 1; done")
		sb.Exec(t, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count="+strconv.Itoa(32*(i+1)))
		actors = append(actors, actor{uid: uid, leaf: testenv.PauseLeaf(uid), sb: sb})
	}
	all := func() []testenv.LeafFigures {
		t.Helper()
		var k []testenv.LeafFigures
		for _, a := range actors {
			k = append(k, pod.Figures(t, a.leaf))
		}
		return k
	}
	within := func(got, lo, hi, slack uint64) bool {
		return got+slack >= min(lo, hi) && got <= max(lo, hi)+slack
	}
	const slack = 1 << 20
	for i, a := range actors {
		t.Logf("actor %s: sentry pid %d; the worker reads its /proc/<pid>/cgroup as %q", a.uid, a.sb.PID, ask("cgroup "+strconv.Itoa(a.sb.PID)))
		for _, bind := range []struct{ name, cmd string }{
			{"by path /" + a.leaf, "sample path /" + a.leaf},
			{"by sentry pid " + strconv.Itoa(a.sb.PID), "sample pid " + strconv.Itoa(a.sb.PID)},
		} {
			k0 := all()
			ans := worker.Ask(t, bind.cmd)
			k1 := all()
			js, ok := strings.CutPrefix(ans, "ok ")
			if !ok {
				t.Errorf("%s: %s", bind.name, ans)
				continue
			}
			var r source.Reading
			if err := json.Unmarshal([]byte(js), &r); err != nil {
				t.Fatalf("%s: %q: %v", bind.name, ans, err)
			}
			if r.MemoryPeakBytes == nil || r.CPUUsageUsec == nil {
				t.Fatalf("%s: peak or CPU absent: %+v (%s)", bind.name, r.Absent, r.Detail)
			}
			t.Logf("%s: statsd current %d, peak %d, cpu %d us; kernel current %d..%d, peak %d..%d, cpu %d..%d us (%s; absent: %+v)",
				bind.name, r.MemoryCurrentBytes, *r.MemoryPeakBytes, *r.CPUUsageUsec,
				k0[i].Current, k1[i].Current, k0[i].Peak, k1[i].Peak, k0[i].CPUUsec, k1[i].CPUUsec, r.Detail, r.Absent)
			for _, f := range []struct {
				name        string
				got, lo, hi uint64
				slack       uint64
			}{
				{"memory current", r.MemoryCurrentBytes, k0[i].Current, k1[i].Current, slack},
				{"memory peak", *r.MemoryPeakBytes, k0[i].Peak, k1[i].Peak, 0},
				{"cpu usage", *r.CPUUsageUsec, k0[i].CPUUsec, k1[i].CPUUsec, 0},
			} {
				if !within(f.got, f.lo, f.hi, f.slack) {
					t.Errorf("%s: %s %d, its leaf's kernel file %d before and %d after (slack %d)", bind.name, f.name, f.got, f.lo, f.hi, f.slack)
				}
			}
			for j, o := range actors {
				if j != i && within(r.MemoryCurrentBytes, k0[j].Current, k1[j].Current, 8*slack) {
					t.Errorf("%s: memory current %d is sibling %s's (%d..%d)", bind.name, r.MemoryCurrentBytes, o.leaf, k0[j].Current, k1[j].Current)
				}
			}
			if !strings.Contains(r.Detail, "/"+a.leaf) || strings.Contains(r.Detail, pod.Name) {
				t.Errorf("%s: detail %q, want the leaf as the worker sees it (/%s), not the host's path", bind.name, r.Detail, a.leaf)
			}
		}
	}
	// The host's cgroup mount, bound into the worker's mount namespace
	// (pod.HostView), is not rooted in the worker's cgroup namespace: the
	// sentry's namespace-relative path is read where the worker's own cgroup
	// is found in it (nsroot.go), the leaf's host path, never another cgroup
	// and never "sandbox gone".
	ans := worker.Ask(t, "sample pid "+strconv.Itoa(actors[0].sb.PID)+" "+pod.HostView)
	t.Logf("by sentry pid through the host's cgroup mount in the worker's namespace: %s", ans)
	if !strings.HasPrefix(ans, "ok ") || !strings.Contains(ans, "/"+pod.Name+"/"+actors[0].leaf+" ") {
		t.Errorf("by sentry pid through the host's mount: %s, want the leaf's host cgroup %s/%s read", ans, pod.Name, actors[0].leaf)
	}
	// The host's path of a leaf is not in the worker's view: no cgroup there.
	ans = worker.Ask(t, "sample path "+actors[0].sb.CgroupPath)
	t.Logf("the host's path %s from inside the worker's namespace: %s", actors[0].sb.CgroupPath, ans)
	if !strings.HasPrefix(ans, "err ") || !strings.Contains(ans, source.ErrNotMeasurable.Error()) {
		t.Errorf("the host's path %s read from inside the namespace: %s, want not measurable", actors[0].sb.CgroupPath, ans)
	}
}

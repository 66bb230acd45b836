package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationContainerdHarness proves the harness the NRI bridge's
// end-to-end tests run against (testenv.StartContainerd): a real containerd
// with NRI and the CRI, a runc pod and a runsc pod started with crictl, and
// an NRI plugin (testenv.NRIRecorder, NRI's Go stub) that must see what the
// bridge will see: RunPodSandbox with the pod's identity, runtime handler,
// pid and cgroups path; Synchronize listing the running pods when it
// connects again; StopPodSandbox and RemovePodSandbox; and, after a
// containerd restart, its connection lost, then (dialling again itself) a
// new Synchronize listing the pods that survived the restart. A plugin that
// does not dial again stays disconnected: NRI's stub never reconnects. It
// also measures the pod start latency (crictl runp) of a few runc pods.
func TestIntegrationContainerdHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real containerd, runc and gVisor pods; not under -short")
	}
	testenv.NeedContainerd(t)
	bins := testenv.BuildContainerd(t)
	c := testenv.StartContainerd(t, testenv.ContainerdOptions{Bins: bins})
	rec := testenv.StartNRIRecorder(t, c.NRISocket(), testenv.NRIRecorderOptions{Reconnect: true})
	passive := testenv.StartNRIRecorder(t, c.NRISocket(), testenv.NRIRecorderOptions{})
	first, _ := rec.Wait(t, 0, 5*time.Second, "Synchronize", kind(testenv.NRISynchronize))
	if len(first.Pods) != 0 {
		t.Errorf("Synchronize on a fresh containerd listed %d pods", len(first.Pods))
	}

	// One pod of each handler: the plugin sees each run with what the
	// bridge binds it by.
	run := func(name, handler string) (testenv.PodSpec, string, time.Duration) {
		spec := testenv.PodSpec{Name: name, Namespace: "team-a", UID: testenv.NewActorUID(), Handler: handler,
			Labels: map[string]string{"app": name}, Annotations: map[string]string{"sandboxstats.test/pod": name}}
		start := time.Now()
		id := c.RunPod(t, spec)
		return spec, id, time.Since(start)
	}
	web, webID, took := run("web", "")
	t.Logf("runc pod %s started in %v", webID[:12], took.Round(time.Millisecond))
	gv, gvID, took := run("gv", "runsc")
	t.Logf("runsc pod %s started in %v", gvID[:12], took.Round(time.Millisecond))
	for _, p := range []struct {
		spec testenv.PodSpec
		id   string
		argv string // the sandbox process's argv[0]
	}{{web, webID, "/bin/sh"}, {gv, gvID, "runsc-sandbox"}} {
		e, _ := rec.Wait(t, 0, 5*time.Second, "RunPodSandbox of "+p.spec.Name, testenv.IsPodEvent(testenv.NRIRunPodSandbox, p.id))
		d := c.InspectPod(t, p.id)
		checkPod(t, e.Pod, p.spec, p.id, d)
		if got := argv0(d.PID); got != p.argv {
			t.Errorf("pod %s: pid %d runs %q, want %q", p.spec.Name, d.PID, got, p.argv)
		}
		// The pid is in the pod's cgroup (v1 memory hierarchy or v2).
		if got := memoryCgroup(t, d.PID); got != d.CgroupsPath {
			t.Errorf("pod %s: pid %d is in the cgroup %q, want %q", p.spec.Name, d.PID, got, d.CgroupsPath)
		}
		t.Logf("pod %s (%s): pid %d (%s), cgroups path %s, handler %q", p.spec.Name, p.id[:12], d.PID, argv0(d.PID), d.CgroupsPath, d.RuntimeHandler)
	}
	pods := c.Pods(t)
	if len(pods) != 2 || pods[0].ID != webID || pods[1].ID != gvID || pods[0].UID != web.UID || pods[1].State != "SANDBOX_READY" {
		t.Errorf("crictl pods: %+v", pods)
	}

	// A plugin connecting again is told of the running pods.
	rec.Disconnect(t)
	mark := len(rec.Events())
	rec.Connect(t)
	sync, _ := rec.Wait(t, mark, 5*time.Second, "Synchronize on reconnect", kind(testenv.NRISynchronize))
	if got := podIDs(sync.Pods); !slices.Equal(got, sorted(webID, gvID)) {
		t.Errorf("Synchronize on reconnect lists %v, want %v", got, sorted(webID, gvID))
	}
	for _, p := range sync.Pods {
		if p.GetPid() == 0 || p.GetLinux().GetCgroupsPath() == "" {
			t.Errorf("Synchronize: pod %s has pid %d, cgroups path %q", p.GetName(), p.GetPid(), p.GetLinux().GetCgroupsPath())
		}
	}

	// Pod start latency: runc pods one after another.
	var lat []time.Duration
	var latIDs []string
	for i := range 5 {
		_, id, took := run(fmt.Sprintf("lat-%d", i), "")
		lat = append(lat, took)
		latIDs = append(latIDs, id)
	}
	sortedLat := slices.Clone(lat)
	slices.Sort(sortedLat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	t.Logf("runc pod start latency (crictl runp wall time, %d pods): min %v, median %v, mean %v, max %v", len(lat),
		sortedLat[0].Round(time.Millisecond), sortedLat[len(lat)/2].Round(time.Millisecond),
		(sum / time.Duration(len(lat))).Round(time.Millisecond), sortedLat[len(lat)-1].Round(time.Millisecond))
	survivor := latIDs[0] // kept across the containerd restart
	for _, id := range latIDs[1:] {
		c.StopPod(t, id)
		c.RemovePod(t, id)
	}

	// The runc pod stopped and removed through the CRI.
	mark = len(rec.Events())
	c.StopPod(t, webID)
	rec.Wait(t, mark, 5*time.Second, "StopPodSandbox of web", testenv.IsPodEvent(testenv.NRIStopPodSandbox, webID))
	c.RemovePod(t, webID)
	rec.Wait(t, mark, 5*time.Second, "RemovePodSandbox of web", testenv.IsPodEvent(testenv.NRIRemovePodSandbox, webID))

	// The runsc pod killed under its runtime: its sandbox dies; the CRI
	// notices (NOTREADY) and tells plugins nothing until the pod is
	// stopped.
	mark = len(rec.Events())
	gvPID := c.InspectPod(t, gvID).PID
	c.KillRunscPod(t, gvID)
	waitPodState(t, c, gvID, "SANDBOX_NOTREADY")
	if err := processAlive(gvPID); err == nil {
		t.Errorf("the runsc pod's sentry (pid %d) is still running", gvPID)
	}
	time.Sleep(200 * time.Millisecond) // any event it causes comes in this time
	if got := rec.Events()[mark:]; len(got) != 0 {
		t.Logf("NRI events after the runsc pod was killed: %s", eventKinds(got))
	}
	c.StopPod(t, gvID)
	rec.Wait(t, mark, 5*time.Second, "StopPodSandbox of the killed runsc pod", testenv.IsPodEvent(testenv.NRIStopPodSandbox, gvID))
	c.RemovePod(t, gvID)
	rec.Wait(t, mark, 5*time.Second, "RemovePodSandbox of the killed runsc pod", testenv.IsPodEvent(testenv.NRIRemovePodSandbox, gvID))

	// A containerd restart: the plugins lose their connection; the pods
	// survive; the plugin that dials again gets a new Synchronize.
	survivorPID := c.InspectPod(t, survivor).PID
	mark, passiveMark := len(rec.Events()), len(passive.Events())
	c.Stop(t)
	closed, _ := rec.Wait(t, mark, 5*time.Second, "the connection's loss", kind(testenv.NRIClosed))
	passive.Wait(t, passiveMark, 5*time.Second, "the connection's loss", kind(testenv.NRIClosed))
	if err := processAlive(survivorPID); err != nil {
		t.Errorf("the runc pod's pid %d did not survive containerd's stop: %v", survivorPID, err)
	}
	restart := time.Now()
	c.Start(t)
	resync, _ := rec.Wait(t, mark, 10*time.Second, "Synchronize after the restart", func(e testenv.NRIEvent) bool {
		return e.Kind == testenv.NRISynchronize && e.Conn > closed.Conn
	})
	t.Logf("containerd restarted (ready in %v); the plugin dialling again every 100 ms had its Synchronize %v after the exec; events: %s",
		c.StartedIn.Round(time.Millisecond), resync.At.Sub(restart).Round(time.Millisecond), eventKinds(rec.Events()[mark:]))
	if got := podIDs(resync.Pods); !slices.Equal(got, []string{survivor}) {
		t.Errorf("Synchronize after the restart lists %v, want [%s]", got, survivor)
	} else if p := resync.Pods[0]; p.GetPid() != uint32(survivorPID) || p.GetUid() == "" {
		t.Errorf("Synchronize after the restart: pod %s pid %d uid %q, want pid %d", p.GetName(), p.GetPid(), p.GetUid(), survivorPID)
	}
	time.Sleep(500 * time.Millisecond) // five of the other's redial periods
	if ok, _ := passive.Connected(); ok || len(passive.Events()) != passiveMark+1 {
		t.Errorf("the plugin that does not dial again: connected %v, events after the stop: %s", ok, eventKinds(passive.Events()[passiveMark:]))
	}

	// The CRI recovered the surviving pod: it stops and is removed as before.
	if d := c.InspectPod(t, survivor); d.State != "SANDBOX_READY" || d.PID != survivorPID {
		t.Errorf("after the restart the surviving pod is %s with pid %d, want SANDBOX_READY with pid %d", d.State, d.PID, survivorPID)
	}
	// containerd 2.4.2 does not tell plugins that a pod which survived its
	// restart stopped or was removed: NRI's pod states are in memory and
	// its Synchronize restores the containers' only (containerd#8426). The
	// bridge must not wait for these events for such pods.
	mark = len(rec.Events())
	c.StopPod(t, survivor)
	c.RemovePod(t, survivor)
	time.Sleep(300 * time.Millisecond)
	for _, e := range rec.Events()[mark:] {
		if e.Pod.GetId() == survivor {
			t.Errorf("containerd %s now delivers %s for a pod that survived its restart (containerd#8426 fixed?): update this test and the bridge's notes", testenv.ContainerdVersion, e.Kind)
		}
	}
	if pods := c.Pods(t); len(pods) != 0 {
		t.Errorf("pods left: %+v", pods)
	}
}

// checkPod compares a pod as NRI described it with what the test asked for
// and what crictl inspectp shows.
func checkPod(t *testing.T, got *api.PodSandbox, spec testenv.PodSpec, id string, d testenv.PodDetail) {
	t.Helper()
	want := map[string]string{"id": id, "uid": spec.UID, "name": spec.Name, "namespace": spec.Namespace,
		"runtime_handler": spec.Handler, "cgroups_path": "/k8s.io/" + id, "pid": strconv.Itoa(d.PID)}
	have := map[string]string{"id": got.GetId(), "uid": got.GetUid(), "name": got.GetName(), "namespace": got.GetNamespace(),
		"runtime_handler": got.GetRuntimeHandler(), "cgroups_path": got.GetLinux().GetCgroupsPath(), "pid": strconv.Itoa(int(got.GetPid()))}
	if !maps.Equal(want, have) {
		t.Errorf("RunPodSandbox of %s: got %v, want %v", spec.Name, have, want)
	}
	if d.PID <= 0 || d.CgroupsPath != want["cgroups_path"] || d.UID != spec.UID {
		t.Errorf("crictl inspectp %s: %+v", spec.Name, d)
	}
	for k, v := range spec.Labels {
		if got.GetLabels()[k] != v {
			t.Errorf("RunPodSandbox of %s: label %s = %q, want %q", spec.Name, k, got.GetLabels()[k], v)
		}
	}
	for k, v := range spec.Annotations {
		if got.GetAnnotations()[k] != v {
			t.Errorf("RunPodSandbox of %s: annotation %s = %q, want %q", spec.Name, k, got.GetAnnotations()[k], v)
		}
	}
}

func kind(k string) func(testenv.NRIEvent) bool {
	return func(e testenv.NRIEvent) bool { return e.Kind == k }
}

func podIDs(pods []*api.PodSandbox) []string {
	ids := make([]string, len(pods))
	for i, p := range pods {
		ids[i] = p.GetId()
	}
	slices.Sort(ids)
	return ids
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func eventKinds(events []testenv.NRIEvent) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, " %s(conn %d)", e.Kind, e.Conn)
	}
	return b.String()
}

// argv0 is the first word of pid's command line.
func argv0(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	first, _, _ := bytes.Cut(b, []byte{0})
	return string(first)
}

// memoryCgroup is pid's cgroup in the v1 memory hierarchy, or its v2 cgroup
// on a unified host.
func memoryCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == "memory" || testenv.CgroupV2() && parts[0] == "0") {
			return parts[2]
		}
	}
	t.Fatalf("/proc/%d/cgroup has no memory cgroup:\n%s", pid, b)
	return ""
}

// processAlive returns nil when pid is a live process (not a zombie).
func processAlive(pid int) error {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return err
	}
	if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
		return fmt.Errorf("pid %d is a zombie", pid)
	}
	return nil
}

// waitPodState waits up to 10 s for crictl to list the pod in state.
func waitPodState(t *testing.T, c *testenv.Containerd, id, state string) {
	t.Helper()
	var last []testenv.PodInfo
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = c.Pods(t)
		for _, p := range last {
			if p.ID == id && p.State == state {
				return
			}
		}
	}
	t.Fatalf("pod %s not %s within 10 s: %+v", id, state, last)
}

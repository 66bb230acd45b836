package testenv

// A Kubernetes pod run on a Containerd as a kubelet runs it: its manifest
// rendered and translated by the deploy module's cripod command (the pod
// sandbox's and each container's CRI config, the volumes made on the node),
// then run with crictl: the init containers one after the other to their
// exit, then the containers.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// CRIPlan is what the cripod command wrote (deploy/kubernetes/cripod/cmd/
// cripod: plan.json): the sandbox's config, each container's configs (one a
// attempt, the kubelet's restarts), the volumes.
type CRIPlan struct {
	Sandbox        string             `json:"sandbox"`
	InitContainers []CRIPlanContainer `json:"initContainers"`
	Containers     []CRIPlanContainer `json:"containers"`
	Name           string             `json:"name"`
	UID            string             `json:"uid"`
	Namespace      string             `json:"namespace"`
	Volumes        []struct {
		Name     string `json:"Name"`
		Path     string `json:"Path"`
		HostPath string `json:"HostPath"`
	} `json:"volumes"`
}

// CRIPlanContainer is one container's configs, attempt n at Attempts[n].
type CRIPlanContainer struct {
	Name     string   `json:"name"`
	Image    string   `json:"image"`
	Attempts []string `json:"attempts"`
}

// Volume is the path on the node of the pod's volume name, or "".
func (p *CRIPlan) Volume(name string) string {
	for _, v := range p.Volumes {
		if v.Name == name {
			return v.Path
		}
	}
	return ""
}

// CRIRender says what RenderCRIPod renders.
type CRIRender struct {
	Kustomization string // its directory
	PodDir        string // the pod's directory on the node
	// HostPaths move host paths (cripod's --host-path FROM=TO).
	HostPaths map[string]string
	// Attempts: configs per container (attempt 0, the kubelet's restarts).
	Attempts int
	// WithoutSeccomp leaves the seccomp profiles out (cripod's
	// --without-seccomp): for a runc without seccomp (RuncSeccomp).
	WithoutSeccomp bool
	// RecursiveReadOnlyMounts: the runtime handler supports recursive
	// read-only mounts (cripod's --recursive-read-only-mounts; see
	// Containerd.RecursiveReadOnlyMounts), as the kubelet learns it.
	RecursiveReadOnlyMounts bool
}

// RenderCRIPod runs the cripod command (go run, in repoRoot's deploy
// module) on r.Kustomization: the DaemonSet's pod for this node in
// r.PodDir, in the node's network namespace (the harness has no CNI).
func RenderCRIPod(t testing.TB, repoRoot string, r CRIRender) *CRIPlan {
	t.Helper()
	args := []string{"run", "./kubernetes/cripod/cmd/cripod", "--kustomization", r.Kustomization, "--out", r.PodDir,
		"--node-network", "--attempts", fmt.Sprint(max(1, r.Attempts))}
	if r.WithoutSeccomp {
		args = append(args, "--without-seccomp")
	}
	if r.RecursiveReadOnlyMounts {
		args = append(args, "--recursive-read-only-mounts")
	}
	var from []string
	for k := range r.HostPaths {
		from = append(from, k)
	}
	sort.Strings(from)
	for _, k := range from {
		args = append(args, "--host-path", k+"="+r.HostPaths[k])
	}
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = filepath.Join(repoRoot, "deploy")
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("cripod %s: %v\n%s", strings.Join(args[2:], " "), err, stderr)
	}
	b, err := os.ReadFile(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("cripod's plan: %v", err)
	}
	var plan CRIPlan
	if err := json.Unmarshal(b, &plan); err != nil {
		t.Fatalf("cripod's plan: %v", err)
	}
	t.Logf("cripod: the pod %s/%s rendered in %v", plan.Namespace, plan.Name, time.Since(start).Round(time.Millisecond))
	return &plan
}

// RuncSeccomp reports whether the harness's runc applies seccomp profiles
// (runc features: linux.seccomp.enabled); one built without libseccomp
// refuses any.
func (c *Containerd) RuncSeccomp(t testing.TB) bool {
	t.Helper()
	out, err := c.run(c.Bins.Runc, "features")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Linux struct {
			Seccomp *struct {
				Enabled *bool `json:"enabled"`
			} `json:"seccomp"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(out, &f); err != nil {
		t.Fatalf("runc features: %v", err)
	}
	return f.Linux.Seccomp != nil && f.Linux.Seccomp.Enabled != nil && *f.Linux.Seccomp.Enabled
}

// RecursiveReadOnlyMounts reports whether the runtime handler (""; the
// default) supports recursive read-only mounts, as the kubelet learns it:
// the CRI RuntimeStatus's handlers' features (crictl info's
// runtimeHandlers).
func (c *Containerd) RecursiveReadOnlyMounts(t testing.TB, handler string) bool {
	t.Helper()
	var info struct {
		Handlers []struct {
			Name     string `json:"name"`
			Features struct {
				RRO bool `json:"recursive_read_only_mounts"`
			} `json:"features"`
		} `json:"runtimeHandlers"`
	}
	out := c.Crictl(t, "info")
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("crictl info: %v", err)
	}
	for _, h := range info.Handlers {
		if h.Name == handler {
			return h.Features.RRO
		}
	}
	t.Fatalf("crictl info lists no runtime handler %q", handler)
	return false
}

// CRIPod is a pod StartCRIPod runs.
type CRIPod struct {
	ID   string            // the sandbox's id
	Plan *CRIPlan          // what it runs
	IDs  map[string]string // container name -> the id of its latest attempt
	c    *Containerd
}

// StartCRIPod runs plan's pod as the kubelet does: the sandbox (crictl
// runp), each init container created, started and waited for (it must exit
// 0 within 60 s), then every container created and started, in order.
func (c *Containerd) StartCRIPod(t testing.TB, plan *CRIPlan) *CRIPod {
	t.Helper()
	start := time.Now()
	out, err := c.crictl(60*time.Second, "runp", plan.Sandbox)
	if err != nil {
		t.Fatalf("run the pod %s: %v\n%s", plan.Name, err, c.logTail(2048))
	}
	p := &CRIPod{ID: strings.TrimSpace(string(out)), Plan: plan, IDs: map[string]string{}, c: c}
	c.mu.Lock()
	c.pods[p.ID] = "/" + criNamespace
	c.podConfigs[p.ID] = plan.Sandbox
	c.mu.Unlock()
	for _, ic := range plan.InitContainers {
		id := p.create(t, ic, 0)
		c.StartContainer(t, id)
		if code := c.WaitExited(t, id, 60*time.Second); code != 0 {
			t.Fatalf("init container %s exited %d:\n%s", ic.Name, code, p.Logs(ic.Name))
		}
	}
	for _, ctr := range plan.Containers {
		c.StartContainer(t, p.create(t, ctr, 0))
	}
	t.Logf("pod %s (%s): %d init containers run, %d containers started in %v", plan.Name, p.ID,
		len(plan.InitContainers), len(plan.Containers), time.Since(start).Round(time.Millisecond))
	return p
}

func (p *CRIPod) create(t testing.TB, ctr CRIPlanContainer, attempt int) string {
	t.Helper()
	if attempt >= len(ctr.Attempts) {
		t.Fatalf("%s: no config for attempt %d (render more attempts)", ctr.Name, attempt)
	}
	out, err := p.c.crictl(60*time.Second, "create", p.ID, ctr.Attempts[attempt], p.Plan.Sandbox)
	if err != nil {
		t.Fatalf("create %s (attempt %d): %v\n%s", ctr.Name, attempt, err, p.c.logTail(2048))
	}
	id := strings.TrimSpace(string(out))
	p.IDs[ctr.Name] = id
	return id
}

// Restart replaces the container name as the kubelet restarts one that
// exited: its next attempt's config (the same config, attempt and restart
// count one more) created and started in the same sandbox. The container
// must have exited.
func (p *CRIPod) Restart(t testing.TB, name string, attempt int) string {
	t.Helper()
	for _, ctr := range p.Plan.Containers {
		if ctr.Name == name {
			id := p.create(t, ctr, attempt)
			p.c.StartContainer(t, id)
			return id
		}
	}
	t.Fatalf("no container %s in the pod", name)
	return ""
}

// Exec runs a command in the container name (crictl exec, 30 s at most)
// and returns its output; an error carries its stderr.
func (p *CRIPod) Exec(name string, cmd ...string) ([]byte, error) {
	return p.c.crictl(40*time.Second, append([]string{"exec", "--timeout", "30", p.IDs[name]}, cmd...)...)
}

// Logs is the latest attempt's log of the container name, as the runtime
// wrote it (CRI log lines: time, stream, tag, line).
func (p *CRIPod) Logs(name string) string {
	var v struct {
		Status struct {
			LogPath string `json:"logPath"`
		} `json:"status"`
	}
	out, err := p.c.crictl(20*time.Second, "inspect", p.IDs[name])
	if err == nil {
		err = json.Unmarshal(out, &v)
	}
	if err != nil {
		return err.Error()
	}
	b, err := os.ReadFile(v.Status.LogPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// ContainerState is a container as crictl inspect shows it.
type ContainerState struct {
	State    string // CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED
	ExitCode int
	Reason   string
	PID      int
}

// InspectContainer inspects a container (crictl inspect).
func (c *Containerd) InspectContainer(t testing.TB, id string) ContainerState {
	t.Helper()
	var v struct {
		Status struct {
			State    string `json:"state"`
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"status"`
		Info struct {
			PID int `json:"pid"`
		} `json:"info"`
	}
	out := c.Crictl(t, "inspect", id)
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("crictl inspect %s: %v", id, err)
	}
	return ContainerState{State: v.Status.State, ExitCode: v.Status.ExitCode, Reason: v.Status.Reason, PID: v.Info.PID}
}

// WaitExited waits up to timeout for the container to exit and returns its
// exit code.
func (c *Containerd) WaitExited(t testing.TB, id string, timeout time.Duration) int {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		st := c.InspectContainer(t, id)
		if st.State == "CONTAINER_EXITED" {
			return st.ExitCode
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still %s after %v", id, st.State, timeout)
		}
	}
}

package testenv

// The pods of a Containerd, through crictl: run, stop, remove, list, inspect,
// and a runsc pod killed under its runtime.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// PodSpec is the part of a CRI PodSandboxConfig a test chooses.
type PodSpec struct {
	Name      string // metadata.name; required
	Namespace string // metadata.namespace; "" is "default"
	UID       string // metadata.uid; "" makes a random one (NewActorUID)
	Labels    map[string]string
	// Annotations become the sandbox's annotations (and the OCI spec's).
	Annotations map[string]string
	// Handler is the runtime handler: "" for the default (runc) or "runsc".
	Handler string
	// CgroupParent is linux.cgroup_parent; "" leaves the pod in containerd's
	// default /k8s.io/<pod id>.
	CgroupParent string
}

// RunPod starts a pod sandbox (crictl runp) in the host's network namespace
// and returns its id.
func (c *Containerd) RunPod(t testing.TB, spec PodSpec) string {
	t.Helper()
	if spec.Name == "" {
		t.Fatal("RunPod: PodSpec.Name is empty")
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if spec.UID == "" {
		spec.UID = NewActorUID()
	}
	linux := map[string]any{
		// NODE (2): the host's network namespace, so no CNI is needed.
		"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}},
	}
	if spec.CgroupParent != "" {
		linux["cgroup_parent"] = spec.CgroupParent
	}
	cfg, err := json.Marshal(map[string]any{
		"metadata":    map[string]any{"name": spec.Name, "namespace": spec.Namespace, "uid": spec.UID, "attempt": 0},
		"labels":      spec.Labels,
		"annotations": spec.Annotations,
		"linux":       linux,
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.Dir, "pods", fmt.Sprintf("%s-%s-%d.json", spec.Namespace, spec.Name, time.Now().UnixNano()))
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"runp"}
	if spec.Handler != "" {
		args = append(args, "--runtime", spec.Handler)
	}
	out, err := c.crictl(60*time.Second, append(args, path)...)
	if err != nil {
		t.Fatalf("run pod %s/%s: %v\n%s", spec.Namespace, spec.Name, err, c.logTail(2048))
	}
	id := strings.TrimSpace(string(out))
	parent := spec.CgroupParent
	if parent == "" {
		parent = "/" + criNamespace
	}
	c.mu.Lock()
	c.pods[id] = parent
	c.podConfigs[id] = path
	c.mu.Unlock()
	return id
}

// StopPod stops a pod (crictl stopp). A runsc pod does not stop through
// the runc shim: end it with KillRunscPod first.
func (c *Containerd) StopPod(t testing.TB, id string) {
	t.Helper()
	c.Crictl(t, "stopp", id)
}

// RemovePod removes a stopped pod (crictl rmp).
// A pod whose sandbox was killed under the runtime may still read running
// to containerd for a moment after stopp returned ("is running, please
// stop it first": it has not yet seen the task exit); it is stopped again
// and removed, for up to 10 s.
func (c *Containerd) RemovePod(t testing.TB, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := c.crictl(60*time.Second, "rmp", id)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "please stop it first") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		c.StopPod(t, id)
	}
}

// PodInfo is a pod as crictl pods lists it.
type PodInfo struct {
	ID, UID, Name, Namespace string
	State                    string // SANDBOX_READY or SANDBOX_NOTREADY
	RuntimeHandler           string // "" for the default handler
	Labels, Annotations      map[string]string
}

// criPod is a pod in crictl's JSON (pods -o json, inspectp's status).
type criPod struct {
	ID       string `json:"id"`
	Metadata struct {
		Name      string `json:"name"`
		UID       string `json:"uid"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	State          string            `json:"state"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations"`
	RuntimeHandler string            `json:"runtimeHandler"`
}

func (p criPod) info() PodInfo {
	return PodInfo{ID: p.ID, UID: p.Metadata.UID, Name: p.Metadata.Name, Namespace: p.Metadata.Namespace,
		State: p.State, RuntimeHandler: p.RuntimeHandler, Labels: p.Labels, Annotations: p.Annotations}
}

// Pods lists the pods (crictl pods -o json), oldest first.
func (c *Containerd) Pods(t testing.TB) []PodInfo {
	t.Helper()
	pods, err := c.listPods()
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func (c *Containerd) listPods() ([]PodInfo, error) {
	out, err := c.crictl(30*time.Second, "pods", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []criPod `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("crictl pods -o json: %w: %q", err, out)
	}
	pods := make([]PodInfo, len(list.Items))
	for i, p := range list.Items {
		pods[len(pods)-1-i] = p.info() // crictl lists the newest first
	}
	return pods, nil
}

// PodDetail is a pod as crictl inspectp shows it.
type PodDetail struct {
	PodInfo
	// PID is the sandbox's init process: the pause process for runc, the
	// sentry (runsc-sandbox) for runsc; 0 once it is gone.
	PID int
	// CgroupsPath is the sandbox's linux.cgroupsPath, e.g. /k8s.io/<id>.
	CgroupsPath string
}

// InspectPod inspects a pod (crictl inspectp -o json).
func (c *Containerd) InspectPod(t testing.TB, id string) PodDetail {
	t.Helper()
	out := c.Crictl(t, "inspectp", "-o", "json", id)
	var v struct {
		Status criPod `json:"status"`
		Info   struct {
			PID            int    `json:"pid"`
			RuntimeHandler string `json:"runtimeHandler"`
			RuntimeSpec    struct {
				Linux struct {
					CgroupsPath string `json:"cgroupsPath"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("crictl inspectp %s: %v: %q", id, err, out)
	}
	d := PodDetail{PodInfo: v.Status.info(), PID: v.Info.PID, CgroupsPath: v.Info.RuntimeSpec.Linux.CgroupsPath}
	if d.RuntimeHandler == "" {
		d.RuntimeHandler = v.Info.RuntimeHandler
	}
	return d
}

// Runsc runs Debian's runsc on the runsc handler's pods (--root RunscRoot,
// the wrapper's flags) and returns its output.
func (c *Containerd) Runsc(args ...string) ([]byte, error) {
	return c.run(c.runsc, append([]string{"--platform=ptrace", "--network=none", "--root", c.RunscRoot}, args...)...)
}

// KillRunscPod ends a runsc pod under its runtime, as if the sandbox died:
// runsc kill -all of its container, then runsc delete -force. (A runsc pod
// does not stop through the runc shim, which would need gVisor's own shim.)
// The pod stays listed, NOTREADY once its shim saw the sandbox exit; stop and
// remove it with StopPod and RemovePod.
func (c *Containerd) KillRunscPod(t testing.TB, id string) {
	t.Helper()
	if out, err := c.Runsc("kill", "--all", id, "KILL"); err != nil {
		t.Logf("runsc kill %s: %v %s", id, err, out)
	}
	if out, err := c.Runsc("delete", "-force", id); err != nil {
		t.Fatalf("runsc delete -force %s: %v %s", id, err, out)
	}
}

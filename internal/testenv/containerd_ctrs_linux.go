package testenv

// The containers of a Containerd's pods, through crictl: create (from the
// pause image, which holds busybox), start, stop, remove, and the state
// files runsc keeps of a runsc pod's containers.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ContainerSpec is the part of a CRI ContainerConfig a test chooses.
type ContainerSpec struct {
	Name string // metadata.name (the pod spec's container name); required
	// Command is the container's command; nil runs the pause image's
	// entrypoint (sleeps until SIGTERM). The image holds busybox in /bin.
	Command []string
	// Image is the container's image reference (imported beforehand, e.g.
	// with Ctr "images import"); "" is the pause image.
	Image string
}

// CreateContainer creates a container in the pod RunPod started as podID
// (crictl create, from spec.Image or the pause image) and returns its id.
func (c *Containerd) CreateContainer(t testing.TB, podID string, spec ContainerSpec) string {
	t.Helper()
	if spec.Name == "" {
		t.Fatal("CreateContainer: ContainerSpec.Name is empty")
	}
	c.mu.Lock()
	podCfg := c.podConfigs[podID]
	c.mu.Unlock()
	if podCfg == "" {
		t.Fatalf("CreateContainer: pod %s was not started by RunPod", podID)
	}
	cfg := map[string]any{
		"metadata": map[string]any{"name": spec.Name, "attempt": 0},
		"image":    map[string]any{"image": c.PauseImage},
		"linux":    map[string]any{},
	}
	if spec.Image != "" {
		cfg["image"] = map[string]any{"image": spec.Image}
	}
	if spec.Command != nil {
		cfg["command"] = spec.Command
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.Dir, "pods", fmt.Sprintf("ctr-%s-%d.json", spec.Name, time.Now().UnixNano()))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.crictl(60*time.Second, "create", podID, path, podCfg)
	if err != nil {
		t.Fatalf("create container %s in pod %s: %v\n%s", spec.Name, podID, err, c.logTail(2048))
	}
	return strings.TrimSpace(string(out))
}

// StartContainer starts a created container (crictl start).
func (c *Containerd) StartContainer(t testing.TB, id string) {
	t.Helper()
	if _, err := c.crictl(60*time.Second, "start", id); err != nil {
		t.Fatalf("start container %s: %v\n%s", id, err, c.logTail(2048))
	}
}

// StopContainer stops a container (crictl stop, SIGTERM then SIGKILL after
// timeout).
func (c *Containerd) StopContainer(t testing.TB, id string, timeout time.Duration) {
	t.Helper()
	if _, err := c.crictl(60*time.Second, "stop", "--timeout", fmt.Sprint(int(timeout.Seconds())), id); err != nil {
		t.Fatalf("stop container %s: %v\n%s", id, err, c.logTail(2048))
	}
}

// RemoveContainer removes a stopped container (crictl rm).
func (c *Containerd) RemoveContainer(t testing.TB, id string) {
	t.Helper()
	if _, err := c.crictl(60*time.Second, "rm", id); err != nil {
		t.Fatalf("remove container %s: %v\n%s", id, err, c.logTail(2048))
	}
}

// RunscStateFiles lists the state files in RunscRoot (runsc's
// "<container id>_sandbox:<sandbox id>.state"): the containers runsc
// knows.
func (c *Containerd) RunscStateFiles() ([]string, error) {
	ents, err := os.ReadDir(c.RunscRoot)
	if err != nil {
		return nil, fmt.Errorf("runsc root %s: %w", c.RunscRoot, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".state") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

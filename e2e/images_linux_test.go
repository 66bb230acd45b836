package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationImagesByDigest proves the images `make images` builds run
// as a kubelet runs the kustomization's: each archive imported into a real
// containerd (ctr images import, as an operator without a registry would),
// then a container created through the CRI from the image's digest
// reference (registry.example.com/sandboxstats/<name>@sha256:...) in a runc
// pod, run to its exit: each binary run with --version (statsd's image runs
// statsctl too) exits 0, with an unknown flag 2 (the harness's pods keep no
// logs: the exit status is what shows the binary ran), as the image's user
// (root for statsd and statsnri, 65532 for statsagent and the Collector).
func TestIntegrationImagesByDigest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images and starts a real containerd; not under -short")
	}
	testenv.NeedContainerd(t)
	bins := testenv.BuildContainerd(t)
	imgs := buildProjectImages(t)
	c := testenv.StartContainerd(t, testenv.ContainerdOptions{Bins: bins})
	for _, img := range imgs {
		c.Ctr(t, "images", "import", img.Path)
	}
	pod := c.RunPod(t, testenv.PodSpec{Name: "images"})
	for i, tc := range []struct {
		image   string
		command []string
		exit    int
		uid     int
	}{
		{"statsd", []string{"/usr/local/bin/statsd", "--version"}, 0, 0},
		{"statsd", []string{"/usr/local/bin/statsd", "--no-such-flag"}, 2, 0},
		{"statsd", []string{"statsctl", "version"}, 0, 0}, // found on the image's PATH
		{"statsagent", []string{"/usr/local/bin/statsagent", "--version"}, 0, 65532},
		{"statsnri", []string{"/usr/local/bin/statsnri", "--version"}, 0, 0},
		{"otelcol", []string{"/usr/local/bin/otelcol", "--version"}, 0, 65532},
	} {
		t.Run(tc.image+"/"+strings.Join(tc.command, " "), func(t *testing.T) {
			ref := ""
			for _, img := range imgs {
				if img.Name == tc.image {
					ref = img.Ref
				}
			}
			if !strings.Contains(ref, "@sha256:") {
				t.Fatalf("no digest reference for %s: %+v", tc.image, imgs)
			}
			id := c.CreateContainer(t, pod, testenv.ContainerSpec{Name: fmt.Sprintf("c%d", i), Command: tc.command, Image: ref})
			c.StartContainer(t, id)
			st := waitImageContainerExited(t, c, id, 30*time.Second)
			if st.Status.ExitCode != tc.exit {
				t.Errorf("%s %q: exit %d, want %d", ref, tc.command, st.Status.ExitCode, tc.exit)
			}
			if got := st.Info.RuntimeSpec.Process.User.UID; got != tc.uid {
				t.Errorf("%s: runs as uid %d, want %d", ref, got, tc.uid)
			}
			if st.Status.Image.Image != ref && !strings.HasSuffix(st.Status.ImageRef, strings.TrimPrefix(ref, ociimage.Registry+"/"+tc.image)) {
				t.Errorf("%s: container's image %q, image ref %q", ref, st.Status.Image.Image, st.Status.ImageRef)
			}
		})
	}
}

// imageContainerStatus is the part of `crictl inspect` the test reads.
type imageContainerStatus struct {
	Status struct {
		State    string `json:"state"`
		ExitCode int    `json:"exitCode"`
		Image    struct {
			Image string `json:"image"`
		} `json:"image"`
		ImageRef string `json:"imageRef"`
	} `json:"status"`
	Info struct {
		RuntimeSpec struct {
			Process struct {
				User struct {
					UID int `json:"uid"`
				} `json:"user"`
			} `json:"process"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

// waitImageContainerExited polls crictl inspect until the container has exited.
func waitImageContainerExited(t *testing.T, c *testenv.Containerd, id string, timeout time.Duration) imageContainerStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var st imageContainerStatus
		if err := json.Unmarshal(c.Crictl(t, "inspect", id), &st); err != nil {
			t.Fatal(err)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s: %s after %v", id, st.Status.State, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

// TestIntegrationBuildContainerd builds (or finds built) the binaries the
// containerd harness runs and checks that each is the pinned version. Run
// with the unit tests, it also fills the cache that the end-to-end tests
// then find: the cold build (minutes: see BuildContainerd) is spent outside
// their time limit (make test runs it first, alone).
func TestIntegrationBuildContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds containerd, runc and crictl from the module proxy; not under -short")
	}
	_, err := exec.LookPath("go")
	Need(t, err == nil, "needs the go command to build containerd")
	bins := BuildContainerd(t)
	// go version -m names the module each binary was built from, at its
	// version (crictl's own --version says "unknown" unless linked with
	// its Makefile's flags).
	for _, c := range []struct{ bin, module, version string }{
		{bins.Containerd, "github.com/containerd/containerd/v2", ContainerdVersion},
		{bins.Shim, "github.com/containerd/containerd/v2", ContainerdVersion},
		{bins.Ctr, "github.com/containerd/containerd/v2", ContainerdVersion},
		{bins.Runc, "github.com/opencontainers/runc", RuncVersion},
		{bins.Crictl, "sigs.k8s.io/cri-tools", CriToolsVersion},
	} {
		out, err := exec.Command(goTool(t), "version", "-m", c.bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v\n%s", c.bin, err, out)
		}
		want := "\tmod\t" + c.module + "\t" + c.version + "\t"
		if !strings.Contains(string(out), want) {
			t.Errorf("go version -m %s: no %q in\n%s", c.bin, want, out)
		}
	}
}

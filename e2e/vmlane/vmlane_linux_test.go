// Package vmlane runs the real-kernel tests that need a pure cgroup v2 host,
// a worker's cgroup namespace or a real AF_VSOCK inside a Debian cloud
// kernel under QEMU TCG (testenv.VMLane): the same tests, with the same
// assertions, as on the host.
package vmlane

import (
	"path/filepath"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

func TestIntegrationCgroupV2Lane(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; not under -short")
	}
	kernel := testenv.NeedVM(t)
	runsc, _ := testenv.NeedRunsc(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	testenv.BuildStaticBinaries(t, bin)
	files := map[string]string{"/usr/bin/runsc": runsc}
	for _, c := range []string{"statsd", "statsctl", "statsagent"} {
		files["/usr/local/bin/"+c] = filepath.Join(bin, c)
	}
	lane := testenv.VMLane{
		Kernel:    kernel,
		Files:     files,
		Modules:   []string{"virtio_pci", "virtio_blk", "vsock_loopback"},
		DiskBytes: 256 << 20,
		Runs: []testenv.VMRun{
			{Name: "gvisor", Binary: testenv.BuildTestBinary(t, dir, "internal/gvisor"), Tests: []string{
				"TestIntegrationRealCgroup", "TestIntegrationThrottling", "TestIntegrationPressure", "TestIntegrationBlockIO",
				"TestIntegrationGVisorSentryPID", "TestIntegrationGVisorMemoryLimit", "TestIntegrationGVisorNetworkNone",
			}},
			{Name: "e2e", Binary: testenv.BuildTestBinary(t, dir, "e2e"), Tests: []string{
				"TestIntegrationGVisorThroughStatsd", "TestIntegrationGVisorOOMKilled", "TestIntegrationGVisorOOMKilledBeforeAnyPoll", "TestIntegrationWorkerCgroupNamespace",
				"TestIntegrationActivationChurnCgroup",
			}},
			{Name: "microvm", Binary: testenv.BuildTestBinary(t, dir, "internal/microvm"), Tests: []string{"TestIntegrationVsockLoopback"}},
		},
	}
	lane.Run(t)
}

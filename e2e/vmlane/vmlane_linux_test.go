// Package vmlane runs the real-kernel tests that need a pure cgroup v2 host,
// a worker's cgroup namespace or a real AF_VSOCK inside a Debian cloud
// kernel under QEMU TCG (testenv.VMLane): the same tests, with the same
// assertions, as on the host.
package vmlane

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationCgroupV2Lane boots the cgroup v2 guest once and runs in it
// the real-kernel tests that hold on both platforms, each reported as a
// subtest "<binary>/<Test>" (docs/platforms.md lists what each verifies).
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
		// The gVisor container tests' burner: 4M shell iterations take
		// minutes under TCG; the lane checks the split with 400k.
		Env: []string{testenv.RunscBurnEnv + "=400000"},
		Runs: []testenv.VMRun{
			{Name: "gvisor", Binary: testenv.BuildTestBinary(t, dir, "internal/gvisor"), Tests: []string{
				"TestIntegrationRealCgroup", "TestIntegrationThrottling", "TestIntegrationPressure", "TestIntegrationBlockIO",
				"TestIntegrationGVisorSentryPID", "TestIntegrationGVisorMemoryLimit", "TestIntegrationGVisorNetworkNone",
				"TestIntegrationUpstreamLeafLayout", "TestIntegrationGVisorContainers", "TestIntegrationSentryOutsideCgroupNamespace",
			}},
			{Name: "drift", Binary: testenv.BuildTestBinary(t, dir, "internal/drift"), Tests: []string{"TestIntegrationOOMKilled"}},
			{Name: "e2e", Binary: testenv.BuildTestBinary(t, dir, "e2e"), Tests: []string{
				"TestIntegrationGVisorThroughStatsd", "TestIntegrationGVisorOOMKilled", "TestIntegrationGVisorOOMKilledBeforeAnyPoll", "TestIntegrationGVisorSentryDiedProcessesLeft",
				"TestIntegrationWorkerCgroupNamespace", "TestIntegrationRunscUpstreamLayout", "TestIntegrationSeveralWorkloads",
				"TestIntegrationActivationChurnCgroup", "TestIntegrationAgentRestartsKillLoop",
				"TestIntegrationGVisorContainersThroughStatsd",
			}},
			{Name: "microvm", Binary: testenv.BuildTestBinary(t, dir, "internal/microvm"), Tests: []string{"TestIntegrationVsockLoopback"}},
		},
	}
	lane.Run(t)
}

// TestIntegrationVMLaneBounded: the lane never hangs on a guest. One that
// stops printing mid-test is killed at the deadline, the test reported
// unfinished with its output and the reason; one whose kernel panics ends
// at once, the reason said.
func TestIntegrationVMLaneBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; not under -short")
	}
	kernel := testenv.NeedVM(t)
	runs := []testenv.VMRun{{Name: "x", Tests: []string{"TestX"}}}
	for _, c := range []struct {
		name, stage2, why string
		timeout, within   time.Duration
	}{
		{"hangs", "echo SBSVM-BEGIN x\necho '=== RUN   TestX'\nsleep 1000\n", "killed at the 20s deadline", 20 * time.Second, 30 * time.Second},
		{"panics", "echo SBSVM-BEGIN x\necho '=== RUN   TestX'\nexit 1\n", "the guest kernel panicked", 2 * time.Minute, 30 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := testenv.VMLane{Kernel: kernel, Runs: runs, Stage2: c.stage2, Timeout: c.timeout, MemoryMiB: 512}.Boot(t)
			r := b.Results["x/TestX"]
			t.Logf("%s after %v; TestX status %q, output %q; last serial lines:\n%s", b.Why, b.Took, r.Status, r.Out, b.Tail)
			if b.Why != c.why || b.Took > c.within {
				t.Errorf("the guest ended %q after %v, want %q within %v", b.Why, b.Took, c.why, c.within)
			}
			if r.Status != "" || len(r.Out) == 0 || r.Out[0] != "=== RUN   TestX" {
				t.Errorf("TestX: status %q, output %q; want unfinished with its output", r.Status, r.Out)
			}
		})
	}
}

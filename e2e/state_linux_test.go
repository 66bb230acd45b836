package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationStateDiskFull: statsd's state directory on a full file
// system (a 4 KiB tmpfs, mounted in statsd's own mount namespace: one page
// holds binding.json, none is left for ended.json). The Checkpoint that
// cannot record the ended activation answered a bare INTERNAL before; it is
// UNAVAILABLE STATE_NOT_PERSISTED, names the file and the cause, changes
// nothing (the workload stays bound), and a retry once there is room... is
// left to the operator: the test checks that the refusal is repeatable.
func TestIntegrationStateDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("runs statsd in its own mount namespace")
	}
	testenv.Need(t, os.Geteuid() == 0, "needs root to mount a tmpfs in a private mount namespace")
	_, err := os.Stat("/usr/bin/unshare")
	testenv.Need(t, err == nil, "needs unshare (util-linux)")
	real := testenv.BuildBinaries(t)
	bin := t.TempDir()
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\nexec /usr/bin/unshare --mount --propagation private /bin/sh -c 'mount -t tmpfs -o size=4k,mode=0700 statsd-state %s && exec %s \"$@\"' statsd \"$@\"\n",
		state, filepath.Join(real, "statsd"))
	if err := os.WriteFile(filepath.Join(bin, "statsd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartStatsdAt(t, bin, filepath.Join(dir, "stats.sock"), filepath.Join(dir, "lifecycle.sock"), state, "--drift-interval", "0")
	lc := lifecycleClient(t, d.Lifecycle)
	run(t, lc, "actor-full", &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/sandboxstats-disk-full"})
	time.Sleep(200 * time.Millisecond) // any baseline write is done
	for attempt := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-full"})
		cancel()
		st := status.Convert(err)
		t.Logf("attempt %d: %v %s: %s", attempt, st.Code(), api.ReasonOf(err), st.Message())
		if st.Code() != codes.Unavailable || api.ReasonOf(err) != api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_STATE_NOT_PERSISTED) {
			t.Fatalf("Checkpoint on a full disk: %v %q, want UNAVAILABLE STATE_NOT_PERSISTED", st.Code(), api.ReasonOf(err))
		}
	}
	// Nothing changed: the workload is still bound (another actor naming
	// its sandbox is refused).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-other"},
		Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/sandboxstats-disk-full"}})
	if api.ReasonOf(err) != api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_WORKLOAD_BOUND) {
		t.Fatalf("after the failed Checkpoint: %v, want the workload still bound", err)
	}
}

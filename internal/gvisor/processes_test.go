package gvisor_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestSandboxProcessesNeedDescent: a gVisor sandbox's processes are the
// sentry's descendants (in its cgroup when that is not the root). With runsc
// --ignore-cgroups the sentry shares its parent's cgroup (a session scope),
// so an unrelated process there must not be counted.
func TestSandboxProcessesNeedDescent(t *testing.T) {
	const scope = "0::/user.slice/user-0.slice/session-1.scope\n"
	for _, tc := range []struct {
		name     string
		sentryCG string
		want     []int32
	}{
		{"sentry in a shared session scope", scope, []int32{300, 301, 302, 320}},
		{"sentry in the root cgroup", "0::/\n", []int32{300, 301, 302, 303}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			proc := func(pid, ppid int32, cg string) {
				testenv.WriteProcFile(t, root, fmt.Sprintf("%d/stat", pid), testenv.ProcStatLine(pid, ppid, "p", 1000))
				testenv.WriteProcFile(t, root, fmt.Sprintf("%d/cgroup", pid), cg)
			}
			proc(300, 1, tc.sentryCG) // the sentry
			proc(301, 300, tc.sentryCG)
			proc(302, 301, tc.sentryCG)       // a grandchild
			proc(303, 300, "0::/elsewhere\n") // a child in another cgroup
			proc(310, 1, tc.sentryCG)         // unrelated, same cgroup
			proc(311, 310, tc.sentryCG)       // its child
			proc(320, 1, tc.sentryCG)         // the gofer: runsc-gofer with the sentry's --root
			proc(321, 1, tc.sentryCG)         // another sandbox's gofer (other --root)
			testenv.WriteProcFile(t, root, "300/cmdline", "runsc-sandbox\x00--root=/run/runsc\x00boot\x00")
			testenv.WriteProcFile(t, root, "320/cmdline", "runsc-gofer\x00--root=/run/runsc\x00gofer\x00")
			testenv.WriteProcFile(t, root, "321/cmdline", "runsc-gofer\x00--root=/run/other\x00gofer\x00")
			testenv.WriteProcFile(t, root, "stat", "cpu 0") // not a pid directory
			got, err := gvisor.SandboxProcesses(root, 300)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sandbox processes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSandboxProcessesSentryGone: a sentry whose /proc entry is gone is not
// measurable, not an empty sandbox.
func TestSandboxProcessesSentryGone(t *testing.T) {
	_, err := gvisor.SandboxProcesses(t.TempDir(), 300)
	if !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotMeasurable wrapping ErrNotExist", err)
	}
}

// TestSandboxProcessesSentryCgroupMalformed: a sentry cgroup file that does
// not parse is a malformed source, not a sandbox in the root cgroup.
func TestSandboxProcessesSentryCgroupMalformed(t *testing.T) {
	root := t.TempDir()
	testenv.WriteProcFile(t, root, "300/stat", testenv.ProcStatLine(300, 1, "runsc-sandbox", 1000))
	testenv.WriteProcFile(t, root, "300/cgroup", "garbage\n")
	_, err := gvisor.SandboxProcesses(root, 300)
	if !errors.Is(err, source.ErrMalformed) {
		t.Errorf("err = %v, want ErrMalformed", err)
	}
}

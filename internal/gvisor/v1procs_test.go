package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestV1ProcsCrossCheck: on cgroup v1, whose cgroup.procs lists only the
// reader's pid namespace, pids.current of the same cgroup tells a dead
// sandbox (0: sandbox_processes 0, so NoProcessLeft) from processes hidden
// by a pid namespace (absent) where pidsHidden saw the namespace; on the
// host's pid namespace cgroup.procs alone decides (pids.current still
// counts unreaped tasks), on a legacy and a hybrid layout.
func TestV1ProcsCrossCheck(t *testing.T) {
	const pause = "/statstest/pause"
	for _, layout := range []struct {
		tree string
		mode Mode
	}{{"v1-signals", ModeLegacy}, {"hybrid-signals", ModeHybrid}} {
		for _, tc := range []struct {
			name        string
			hidden      bool
			procs, pids string // "-" removes the pids cgroup
			want        *uint32
			wantWhy     string // a prefix of the absent reason
		}{
			{name: "listed", procs: "4211\n4230\n", pids: "7\n", want: u32(2)},
			{name: "empty list, no task: dead", procs: "", pids: "0\n", want: u32(0)},
			// Unreaped tasks stay in pids.current after they left
			// cgroup.procs: on the host's pid namespace the list is the
			// truth, so a dead sandbox is seen dead at once.
			{name: "empty list, tasks left: the list wins", procs: "", pids: "3\n", want: u32(0)},
			{name: "empty list, no pids cgroup: as listed", procs: "", pids: "-", want: u32(0)},
			{name: "pid namespace seen, no task: dead", hidden: true, procs: "4211\n", pids: "0\n", want: u32(0)},
			{name: "pid namespace seen, tasks left", hidden: true, procs: "", pids: "5\n", wantWhy: "statsd runs in a pid namespace of its own"},
			{name: "pid namespace seen, no pids cgroup", hidden: true, procs: "", pids: "-", wantWhy: "statsd runs in a pid namespace of its own"},
		} {
			t.Run(layout.tree+"/"+tc.name, func(t *testing.T) {
				root := copyTree(t, filepath.Join("testdata", "cgroup", layout.tree))
				mem, pids := filepath.Join(root, "memory"+pause), filepath.Join(root, "pids"+pause)
				writeFile(t, filepath.Join(mem, "cgroup.procs"), tc.procs)
				if tc.pids == "-" {
					if err := os.RemoveAll(pids); err != nil {
						t.Fatal(err)
					}
				} else {
					writeFile(t, filepath.Join(pids, "pids.current"), tc.pids)
				}
				proc := t.TempDir()
				if tc.hidden {
					// Another pid than ours: a pod without hostPID reading the host's /proc.
					if err := os.Symlink("1", filepath.Join(proc, "self")); err != nil {
						t.Fatal(err)
					}
				}
				s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: pause},
					Config{CgroupRoot: root, ProcRoot: proc, ReadTimeout: time.Second, Logger: discard(), Mode: layout.mode})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				r, err := s.Sample(context.Background())
				if err != nil {
					t.Fatalf("Sample() error = %v", err)
				}
				if diff := cmp.Diff(tc.want, r.SandboxProcesses); diff != "" {
					t.Errorf("sandbox_processes (-want +got):\n%s", diff)
				}
				if got, want := r.NoProcessLeft(), tc.want != nil && *tc.want == 0; got != want {
					t.Errorf("NoProcessLeft() = %v, want %v", got, want)
				}
				var why string
				for _, a := range r.Absent {
					if a.Field == "sandbox_processes" {
						why = a.Reason
					}
				}
				wantWhy := os.Expand(tc.wantWhy, func(k string) string {
					return map[string]string{"m": mem, "p": pids}[k]
				})
				if tc.wantWhy == "" && why != "" || len(why) < len(wantWhy) || why[:len(wantWhy)] != wantWhy {
					t.Errorf("sandbox_processes absent reason = %q, want prefix %q", why, wantWhy)
				}
			})
		}
	}
}

package source

import "testing"

func TestNoProcessLeft(t *testing.T) {
	n := func(v uint32) *uint32 { return &v }
	for _, tc := range []struct {
		name string
		r    Reading
		want bool
	}{
		{"unknown", Reading{}, false},
		{"processes in the cgroup", Reading{SandboxProcesses: n(3), Pids: &Pids{Current: 3}}, false},
		{"none, no pids controller", Reading{SandboxProcesses: n(0)}, true},
		{"none anywhere", Reading{SandboxProcesses: n(0), Pids: &Pids{Current: 0}}, true},
		{"a pod-level cgroup: its tasks below it", Reading{SandboxProcesses: n(0), Pids: &Pids{Current: 5}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.NoProcessLeft(); got != tc.want {
				t.Errorf("NoProcessLeft() = %v, want %v", got, tc.want)
			}
		})
	}
}

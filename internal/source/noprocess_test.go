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
		{"none", Reading{SandboxProcesses: n(0)}, true},
		{"none, whatever pids.current says", Reading{SandboxProcesses: n(0), Pids: &Pids{Current: 5}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.NoProcessLeft(); got != tc.want {
				t.Errorf("NoProcessLeft() = %v, want %v", got, tc.want)
			}
		})
	}
}

package source

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestContainersSurviveTheStateFiles: identity persists readings as JSON
// (an ended record's final, a guest agent's baseline); a reading's
// containers and sandbox share come back as they were, absent figures
// absent, and a reading without them writes nothing for them (older
// state files read the same).
func TestContainersSurviveTheStateFiles(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	for _, tc := range []struct {
		name string
		r    Reading
	}{
		{"a Kata reading", Reading{Kind: KindGuestAgent, CPUUsageUsec: u(3), Containers: []Container{
			{ID: "busy", CPUUsageUsec: u(2), CPUUserUsec: u(2), CPUSystemUsec: u(0), MemoryCurrentBytes: u(0), MemoryWorkingSetBytes: u(0), MemoryIsOwn: true, PidsCurrent: u(7)},
			{ID: "idle", Name: "sidecar", CPUUsageUsec: u(1), Absent: []Absent{{Field: "pids_current", Reason: "no pids controller"}}},
		}}},
		{"a gVisor reading", Reading{Kind: KindCgroup, SandboxOwnCPUUsec: u(0), Containers: []Container{{ID: "c", CPUUsageUsec: u(1)}}}},
		{"no containers", Reading{Kind: KindCgroup, CPUUsageUsec: u(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.r)
			if err != nil {
				t.Fatal(err)
			}
			var got Reading
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.r, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	b, _ := json.Marshal(Reading{})
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["Containers"]; ok {
		t.Errorf("a reading without containers writes them: %s", b)
	}
	if _, ok := m["SandboxOwnCPUUsec"]; ok {
		t.Errorf("a reading without a sandbox share writes it: %s", b)
	}
}

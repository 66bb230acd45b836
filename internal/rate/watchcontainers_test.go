package rate

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ctrs sets a sample's containers (id -> CPU µs, nil: absent) and own
// share (nil: absent).
func ctrs(own *uint64, cs ...*sandboxstatsv1.ContainerStats) func(*sandboxstatsv1.WorkloadStatsSample) {
	return func(s *sandboxstatsv1.WorkloadStatsSample) { s.SandboxOwnCpuUsec, s.Containers = own, cs }
}

func wctr(id string, cpu *uint64, exited bool) *sandboxstatsv1.ContainerStats {
	return &sandboxstatsv1.ContainerStats{Id: id, CpuUsageUsec: cpu, Exited: exited,
		MemoryCurrentBytes: proto.Uint64(5 << 20), MemoryIsOwn: !exited}
}

// TestWatcherContainers: each container's cores over the row's interval
// by id; none at the first sight, for a container new since the previous
// sample (first-sight), for one whose counter went down (counter-reset)
// or whose CPU is absent on either side, nor when the row has no rate
// (an epoch reset); an exited one is rated (0) and marked; memory only
// where it is the container's own; the own share's cores where both
// samples carry it and it did not decrease.
func TestWatcherContainers(t *testing.T) {
	u := proto.Uint64
	steps := []*sandboxstatsv1.WorkloadStatsSample{
		smp(0, 10_000_000, ctrs(u(100_000), wctr("a", u(1_000_000), false), wctr("b", u(500_000), false), wctr("c", nil, false))),
		smp(2, 12_000_000, ctrs(u(300_000), wctr("a", u(2_000_000), false), wctr("b", u(400_000), false), wctr("c", u(7), false), wctr("d", u(9), false))),
		smp(4, 13_000_000, ctrs(u(200_000), wctr("a", u(2_000_000), true))),
		smp(6, 100, epoch(base), ctrs(nil, wctr("a", u(2_000_000), true))),
	}
	type view struct {
		ID     string
		Cores  *float64
		Exited bool
		Event  Event
		Mem    bool
	}
	f := func(v float64) *float64 { return &v }
	want := [][]view{
		{{"a", nil, false, "", true}, {"b", nil, false, "", true}, {"c", nil, false, "", true}},
		{{"a", f(0.5), false, "", true}, {"b", nil, false, EventCounterReset, true}, {"c", nil, false, "", true}, {"d", nil, false, EventFirst, true}},
		{{"a", f(0), true, "", false}},
		{{"a", nil, true, "", false}},
	}
	wantOwn := []*float64{nil, f(0.1), nil, nil}
	var w Watcher
	for i, s := range steps {
		r := w.Observe(s)
		var got []view
		for _, c := range r.Containers {
			got = append(got, view{c.ID, c.CPUCores, c.Exited, c.Event, c.MemoryCurrentBytes != nil})
		}
		if diff := cmp.Diff(want[i], got); diff != "" {
			t.Errorf("step %d containers (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(wantOwn[i], r.SandboxOwnCPUCores); diff != "" {
			t.Errorf("step %d own share's cores (-want +got):\n%s", i, diff)
		}
	}
}

package nodeagent

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestInterfaceRotationBounded: with --label-interface, a guest naming 16
// new interfaces every sweep (it names its own) added 128 series a sweep
// for ever (25,626 after 200 sweeps, found by a hostile test); a label set
// now exports at most maxInterfacesPerSet names, the rest charged to
// interface "(other)", so the per-interface sums stay whole.
func TestInterfaceRotationBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: time.Minute, Started: t0, LabelInterface: true}, discard())
	if err != nil {
		t.Fatal(err)
	}
	epoch := t0.Add(10 * time.Second)
	series := func() int {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range fams {
			n += len(f.GetMetric())
		}
		return n
	}
	var after10, txSum int
	const sweeps = 200
	for i := range sweeps {
		at := t0.Add(time.Duration(20+60*i) * time.Second)
		s := signalSample("w1", epoch, at, uint64(4_000_000+i*1000))
		s.Network.Interfaces = nil
		for j := range 16 {
			s.Network.Interfaces = append(s.Network.Interfaces, &sandboxstatsv1.InterfaceCounters{Name: fmt.Sprintf("r%05d-%02d", i, j), TxBytes: 100})
		}
		m.Apply([]sweep.DaemonResult{okResult("1", s)}, at, 0)
		if i == 9 {
			after10 = series()
		}
	}
	got := series()
	t.Logf("series after 10 sweeps %d, after %d sweeps %d", after10, sweeps, got)
	if got > after10+8 { // at most one more name, (other), per network counter
		t.Errorf("%d series after %d sweeps, %d after 10: the interface names grow the export", got, sweeps, after10)
	}
	fams, _ := reg.Gather()
	for _, f := range fams {
		if f.GetName() != "sandboxstats_workload_network_transmit_bytes_total" {
			continue
		}
		names := map[string]bool{}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "interface" {
					names[l.GetValue()] = true
				}
			}
			txSum += int(mt.GetCounter().GetValue())
		}
		if len(names) != maxInterfacesPerSet+1 || !names[otherInterface] {
			t.Errorf("%d interface names exported (other %v), want %d and %q", len(names), names[otherInterface], maxInterfacesPerSet+1, otherInterface)
		}
	}
	t.Logf("transmit bytes over every interface series: %d", txSum)
}

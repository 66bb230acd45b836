package server

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestTrimKeepsTheAccountedInterfaces: a sample over its cap (after its text
// is cut) keeps the interfaces the node agent accounts apart
// (api.InterfacesApart: the first 16 named, non-loopback ones) before it
// loses the list, so with --label-interface the agent still charges them:
// its head from the baseline's first read and its tail from an ended
// record's final.
func TestTrimKeepsTheAccountedInterfaces(t *testing.T) {
	ifs := []*sandboxstatsv1.InterfaceCounters{{Name: "lo"}, {Name: ""}}
	for i := range 2000 {
		ifs = append(ifs, &sandboxstatsv1.InterfaceCounters{Name: fmt.Sprintf("eth%d", i), RxBytes: uint64(i), TxBytes: 1 << 40})
	}
	shared := ifs[:]
	s := &sandboxstatsv1.WorkloadStatsSample{Network: &sandboxstatsv1.NetworkStats{Interfaces: ifs}}
	capSample(s)
	got := s.GetNetwork().GetInterfaces()
	if len(got) != rate.MaxInterfaces {
		t.Fatalf("%d interfaces kept, want %d (absent %v)", len(got), rate.MaxInterfaces, s.GetAbsent())
	}
	for i, f := range got {
		if f.GetRxBytes() != uint64(i) {
			t.Fatalf("kept interface %d is %q: not the first named ones in order", i, f.GetName())
		}
	}
	// What the node agent accounts apart (rate's readings take
	// api.InterfacesApart) is what the trimmed sample has.
	if diff := cmp.Diff(api.InterfacesApart(shared), got, protocmp.Transform()); diff != "" {
		t.Errorf("kept (-accounted apart +kept):\n%s", diff)
	}
	if len(s.GetAbsent()) != 1 || s.GetAbsent()[0].GetField() != "network.interfaces" {
		t.Errorf("absent = %v, want the one cut named", s.GetAbsent())
	}
	if len(shared) != 2002 || shared[20].GetRxBytes() != 18 {
		t.Error("the cut changed a slice it did not make")
	}
}

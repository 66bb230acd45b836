package source

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNewNetwork(t *testing.T) {
	lo := InterfaceCounters{Name: "lo", RxBytes: 7, TxBytes: 7}
	eth := InterfaceCounters{Name: "eth0", RxBytes: 100, TxBytes: 200, RxPackets: 3, TxDropped: 1}
	veth := InterfaceCounters{Name: "veth1", RxBytes: 1, TxBytes: 2}
	for _, tc := range []struct {
		name   string
		ifaces []InterfaceCounters
		want   *Network
	}{
		{"loopback apart, the rest summed", []InterfaceCounters{lo, eth, veth}, &Network{
			Layer: NetworkLayerGuest, Origin: "o", Loopback: &lo, Interfaces: []InterfaceCounters{eth, veth},
			Total: &InterfaceCounters{Name: "total", RxBytes: 101, TxBytes: 202, RxPackets: 3, TxDropped: 1},
		}},
		{"only loopback: no network, not a zero one", []InterfaceCounters{lo}, &Network{
			Layer: NetworkLayerGuest, Origin: "o", Loopback: &lo, LoopbackOnly: true,
		}},
		{"nothing at all", nil, &Network{Layer: NetworkLayerGuest, Origin: "o", LoopbackOnly: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, NewNetwork(NetworkLayerGuest, "o", tc.ifaces)); diff != "" {
				t.Errorf("NewNetwork (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAddSat(t *testing.T) {
	if got := AddSat(math.MaxUint64-1, 5); got != math.MaxUint64 {
		t.Errorf("AddSat overflow = %d", got)
	}
	c := InterfaceCounters{Name: "x", RxBytes: math.MaxUint64}
	c.Add(InterfaceCounters{Name: "y", RxBytes: 1, TxBytes: 2})
	if c.Name != "x" || c.RxBytes != math.MaxUint64 || c.TxBytes != 2 {
		t.Errorf("Add = %+v", c)
	}
}

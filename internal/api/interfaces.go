package api

import sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"

// The interfaces of one sample a consumer accounts apart (the node agent's
// --label-interface): at most MaxInterfacesApart, each name at most
// MaxInterfaceName bytes. statsd's answer bounds keep them longest, so a
// sample trimmed to them charges the same.
const (
	MaxInterfacesApart = 16
	MaxInterfaceName   = 32
)

// InterfacesApart returns the interfaces of ifs accounted apart: the first
// MaxInterfacesApart with a name (not loopback, not longer than
// MaxInterfaceName, each name once), in their order. The others are not
// accounted one by one (a guest agent's list is the guest's to make).
func InterfacesApart(ifs []*sandboxstatsv1.InterfaceCounters) []*sandboxstatsv1.InterfaceCounters {
	var out []*sandboxstatsv1.InterfaceCounters
	seen := map[string]bool{}
	for _, ifc := range ifs {
		name := ifc.GetName()
		if len(out) == MaxInterfacesApart || seen[name] || name == "" || name == "lo" || len(name) > MaxInterfaceName {
			continue
		}
		seen[name] = true
		out = append(out, ifc)
	}
	return out
}

package server

import (
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestDriftEnumsMatchTheWire: the drift package's kinds and event types
// convert to the wire by number, so every number must mean the same on both
// sides, and every wire value must have a drift counterpart.
func TestDriftEnumsMatchTheWire(t *testing.T) {
	for n, name := range sandboxstatsv1.DriftKind_name {
		if got, want := drift.Kind(n).String(), strings.TrimPrefix(name, "DRIFT_KIND_"); got != want {
			t.Errorf("drift.Kind(%d) = %s, wire %s", n, got, name)
		}
	}
	for n, name := range sandboxstatsv1.DriftEventType_name {
		if n == 0 {
			continue
		}
		if got, want := drift.EventType(n).String(), strings.TrimPrefix(name, "DRIFT_EVENT_TYPE_"); got != want {
			t.Errorf("drift.EventType(%d) = %s, wire %s", n, got, name)
		}
	}
}

// TestEnumsMatchTheWire: the domain enums that convert to the wire by
// number.
func TestEnumsMatchTheWire(t *testing.T) {
	for n, want := range map[source.NetworkLayer]sandboxstatsv1.NetworkLayer{
		source.NetworkLayerUnspecified:   sandboxstatsv1.NetworkLayer_NETWORK_LAYER_UNSPECIFIED,
		source.NetworkLayerHostNamespace: sandboxstatsv1.NetworkLayer_NETWORK_LAYER_HOST_NAMESPACE,
		source.NetworkLayerGuest:         sandboxstatsv1.NetworkLayer_NETWORK_LAYER_GUEST,
	} {
		if got := sandboxstatsv1.NetworkLayer(n); got != want {
			t.Errorf("NetworkLayer %d converts to %v, want %v", n, got, want)
		}
	}
}

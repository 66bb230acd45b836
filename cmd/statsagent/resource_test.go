package main

import (
	"slices"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/telemetry"
)

// TestResourceInRegistry: the OTLP resource's attributes are the
// registry's, the required ones always there.
func TestResourceInRegistry(t *testing.T) {
	reg, err := telemetry.Load("../../docs/telemetry/registry.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"", "node-1"} {
		var keys []string
		for _, kv := range resourceAttrs(node) {
			keys = append(keys, string(kv.Key))
			if !slices.Contains(reg.Resource.Required, string(kv.Key)) && !slices.Contains(reg.Resource.Optional, string(kv.Key)) {
				t.Errorf("resource attribute %q is not in the registry", kv.Key)
			}
		}
		for _, k := range reg.Resource.Required {
			if !slices.Contains(keys, k) {
				t.Errorf("required resource attribute %q missing (node %q)", k, node)
			}
		}
		if node != "" && !slices.Contains(keys, "k8s.node.name") {
			t.Error("no k8s.node.name with a node name")
		}
	}
}

package server

import (
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/identity"
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

// TestActivationEnumsMatchTheWire: outcome, provenance and baseline kind
// convert by number.
func TestActivationEnumsMatchTheWire(t *testing.T) {
	for n, want := range map[identity.Outcome]sandboxstatsv1.ActivationOutcome{
		identity.OutcomeUnspecified:  sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_UNSPECIFIED,
		identity.OutcomeCheckpointed: sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED,
		identity.OutcomeSandboxDead:  sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_SANDBOX_DEAD,
		identity.OutcomeOOMKilled:    sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_OOM_KILLED,
		identity.OutcomeReplaced:     sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED,
	} {
		if got := sandboxstatsv1.ActivationOutcome(n); got != want {
			t.Errorf("Outcome %d converts to %v, want %v", n, got, want)
		}
	}
	for n, want := range map[identity.Provenance]sandboxstatsv1.FinalProvenance{
		identity.ProvenanceUnspecified:  sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_UNSPECIFIED,
		identity.ProvenanceReadAtEnd:    sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END,
		identity.ProvenanceLastGoodPoll: sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL,
		identity.ProvenanceNone:         sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_NONE,
	} {
		if got := sandboxstatsv1.FinalProvenance(n); got != want {
			t.Errorf("Provenance %d converts to %v, want %v", n, got, want)
		}
	}
	for n, want := range map[identity.BaselineKind]sandboxstatsv1.BaselineKind{
		identity.BaselineUnspecified: sandboxstatsv1.BaselineKind_BASELINE_KIND_UNSPECIFIED,
		identity.BaselineEpochStart:  sandboxstatsv1.BaselineKind_BASELINE_KIND_EPOCH_START,
		identity.BaselineFirstRead:   sandboxstatsv1.BaselineKind_BASELINE_KIND_FIRST_READ,
	} {
		if got := sandboxstatsv1.BaselineKind(n); got != want {
			t.Errorf("BaselineKind %d converts to %v, want %v", n, got, want)
		}
	}
	if n := len(sandboxstatsv1.ActivationOutcome_name) + len(sandboxstatsv1.FinalProvenance_name) + len(sandboxstatsv1.BaselineKind_name); n != 5+4+3 {
		t.Errorf("the wire has %d values of these enums; add the new ones to identity and to this test", n)
	}
}

// TestEnumsConvertByNumber: the sandbox class and the source kind convert
// by number both ways.
func TestEnumsConvertByNumber(t *testing.T) {
	for d, w := range map[source.Class]sandboxstatsv1.SandboxClass{
		source.ClassUnspecified: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_UNSPECIFIED,
		source.ClassGVisor:      sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		source.ClassMicroVM:     sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
	} {
		if classToProto(d) != w || classFromProto(w) != d {
			t.Errorf("class %v <-> %v", d, w)
		}
	}
	for d, w := range map[source.Kind]sandboxstatsv1.StatsSource{
		source.KindUnspecified: sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED,
		source.KindCgroup:      sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		source.KindGuestAgent:  sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT,
	} {
		if kindToProto(d) != w {
			t.Errorf("kind %v -> %v, want %v", d, kindToProto(d), w)
		}
	}
	if n := len(sandboxstatsv1.SandboxClass_name) + len(sandboxstatsv1.StatsSource_name); n != 6 {
		t.Errorf("the wire has %d classes and sources; add the new ones to source and to this test", n)
	}
	if got := classFromProto(sandboxstatsv1.SandboxClass(7)); identity.ValidateRef(source.SandboxRef{Class: got, CgroupPath: "/x"}) == nil {
		t.Error("a class this build does not know passed validation")
	}
}

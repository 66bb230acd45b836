// Package api holds what both sides of the sandboxstats API share beyond the
// generated code in proto/sandboxstats/v1: the domain of every error's
// google.rpc.ErrorInfo and how to read its reason back, and the label names
// of the API's enums as metrics, tables and logs print them.
//
// It depends on the generated code and gRPC only, so that a client
// (statsctl, the node agent) links nothing of the daemon.
package api

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every statsd error.
const ErrorDomain = "sandboxstats.dev"

// Reason returns the ErrorInfo reason string of r: its enum value name without
// the ERROR_REASON_ prefix.
func Reason(r sandboxstatsv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), "ERROR_REASON_")
}

// ReasonOf extracts the ErrorInfo reason of a statsd error ("" if none).
func ReasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// SourceName is the label value of a source: "cgroup", "guest-agent" or
// "unspecified" (also for a value this build does not know).
func SourceName(s sandboxstatsv1.StatsSource) string {
	switch s {
	case sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP:
		return "cgroup"
	case sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT:
		return "guest-agent"
	default:
		return "unspecified"
	}
}

// ClassName is the label value of a sandbox class: "gvisor", "microvm" or
// "unspecified" (also for a value this build does not know).
func ClassName(c sandboxstatsv1.SandboxClass) string {
	switch c {
	case sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR:
		return "gvisor"
	case sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM:
		return "microvm"
	default:
		return "unspecified"
	}
}

// DriftKindName is a drift kind without its enum prefix ("SANDBOX_DEAD"),
// or "UNKNOWN" for a value this build does not know (a newer daemon's).
func DriftKindName(k sandboxstatsv1.DriftKind) string {
	if _, known := sandboxstatsv1.DriftKind_name[int32(k)]; !known {
		return "UNKNOWN"
	}
	return strings.TrimPrefix(k.String(), "DRIFT_KIND_")
}

// KVMStateName is the label of a KVM source's state: "available",
// "partial", "unavailable", "not configured" or "unspecified" (also for a
// value this build does not know).
func KVMStateName(s sandboxstatsv1.KvmSourceState) string {
	switch s {
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_AVAILABLE:
		return "available"
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_PARTIAL:
		return "partial"
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE:
		return "unavailable"
	case sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED:
		return "not configured"
	default:
		return "unspecified"
	}
}

// KVMCounterKindName is the label of a KVM counter's kind: "counter",
// "gauge", "peak" or "unspecified" (also for a value this build does not
// know).
func KVMCounterKindName(k sandboxstatsv1.KvmCounterKind) string {
	switch k {
	case sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE:
		return "counter"
	case sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_GAUGE:
		return "gauge"
	case sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_PEAK:
		return "peak"
	default:
		return "unspecified"
	}
}

// KVMSourceName is the label of a KVM source: "debugfs", "qmp" or
// "unspecified" (also for a value this build does not know).
func KVMSourceName(s sandboxstatsv1.KvmSource) string {
	switch s {
	case sandboxstatsv1.KvmSource_KVM_SOURCE_DEBUGFS:
		return "debugfs"
	case sandboxstatsv1.KvmSource_KVM_SOURCE_QMP:
		return "qmp"
	default:
		return "unspecified"
	}
}

// DriftEventTypeName is a drift event type without its enum prefix
// ("OPENED"), or "UNKNOWN" for a value this build does not know.
func DriftEventTypeName(t sandboxstatsv1.DriftEventType) string {
	if _, known := sandboxstatsv1.DriftEventType_name[int32(t)]; !known {
		return "UNKNOWN"
	}
	return strings.TrimPrefix(t.String(), "DRIFT_EVENT_TYPE_")
}

// NoSampleReasonName is a no-sample reason without its enum prefix
// ("NO_WORKLOAD"), or "UNKNOWN" for a value this build does not know.
func NoSampleReasonName(r sandboxstatsv1.NoSampleReason) string {
	if _, known := sandboxstatsv1.NoSampleReason_name[int32(r)]; !known {
		return "UNKNOWN"
	}
	return strings.TrimPrefix(r.String(), "NO_SAMPLE_REASON_")
}

// OutcomeName is the label value of an activation outcome: "checkpointed",
// "sandbox-dead", "oom-killed", "replaced", or "unknown".
func OutcomeName(o sandboxstatsv1.ActivationOutcome) string {
	return labelOf(o, "ACTIVATION_OUTCOME_")
}

// ProvenanceName is the label value of a final sample's provenance:
// "read-at-end", "last-good-poll", "none", or "unknown".
func ProvenanceName(p sandboxstatsv1.FinalProvenance) string {
	return labelOf(p, "FINAL_PROVENANCE_")
}

// labelOf turns an enum value into a label value: its name without prefix,
// lower case, '_' as '-'; "unknown" for 0 or a value this build does not
// know.
func labelOf(e protoreflect.Enum, prefix string) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil || e.Number() == 0 {
		return "unknown"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix)), "_", "-")
}

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

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every statsd error.
const ErrorDomain = "sandboxstats.dev"

// Reason returns the ErrorInfo reason string of r: its enum value name without
// the ERROR_REASON_ prefix.
func Reason(r sandboxstatsv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), "ERROR_REASON_")
}

// errorInfoName is the full name of google.rpc.ErrorInfo, the end of its
// type URL in a status's details.
const errorInfoName = "google.rpc.ErrorInfo"

// The fields of google.rpc.ErrorInfo this package writes and reads.
const (
	errorInfoReason protowire.Number = 1
	errorInfoDomain protowire.Number = 2
)

// WithErrorInfo returns st with a google.rpc.ErrorInfo detail of reason in
// ErrorDomain, the bytes proto.Marshal writes for that ErrorInfo. They are
// written (and read back, ReasonOf) by hand so that statsd links no
// errdetails: its descriptors, registered at start, were 11 KiB of an idle
// statsd's memory. A client that links errdetails reads the detail with
// status.Details as before.
func WithErrorInfo(st *status.Status, reason string) *status.Status {
	var b []byte
	b = protowire.AppendTag(b, errorInfoReason, protowire.BytesType)
	b = protowire.AppendString(b, reason)
	b = protowire.AppendTag(b, errorInfoDomain, protowire.BytesType)
	b = protowire.AppendString(b, ErrorDomain)
	p := st.Proto()
	p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + errorInfoName, Value: b})
	return status.FromProto(p)
}

// ReasonOf extracts the ErrorInfo reason of a statsd error ("" if none).
func ReasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Proto().GetDetails() {
		if !strings.HasSuffix(d.GetTypeUrl(), "/"+errorInfoName) {
			continue
		}
		if reason, domain, ok := parseErrorInfo(d.GetValue()); ok && domain == ErrorDomain {
			return reason
		}
	}
	return ""
}

// parseErrorInfo reads the reason and the domain of an ErrorInfo's bytes
// (its metadata skipped); ok is false when they do not parse.
func parseErrorInfo(b []byte) (reason, domain string, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", false
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == errorInfoReason || num == errorInfoDomain) {
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return "", "", false
			}
			if num == errorInfoReason {
				reason = v
			} else {
				domain = v
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "", "", false
		}
		b = b[n:]
	}
	return reason, domain, true
}

// SourceName is the label value of a source: "cgroup", "guest-agent" or
// "unspecified" (also for a value this build does not know).
func SourceName(s sandboxstatsv1.StatsSource) string {
	return nameOr(s, "STATS_SOURCE_", "-", "unspecified")
}

// ClassName is the label value of a sandbox class: "gvisor", "microvm" or
// "unspecified" (also for a value this build does not know).
func ClassName(c sandboxstatsv1.SandboxClass) string {
	return nameOr(c, "SANDBOX_CLASS_", "-", "unspecified")
}

// DriftKindName is a drift kind without its enum prefix ("SANDBOX_DEAD"),
// or "UNKNOWN" for a value this build does not know (a newer daemon's).
func DriftKindName(k sandboxstatsv1.DriftKind) string { return upperName(k, "DRIFT_KIND_") }

// DriftEventTypeName is a drift event type without its enum prefix
// ("OPENED"), or "UNKNOWN" for a value this build does not know.
func DriftEventTypeName(t sandboxstatsv1.DriftEventType) string {
	return upperName(t, "DRIFT_EVENT_TYPE_")
}

// NoSampleReasonName is a no-sample reason without its enum prefix
// ("NO_WORKLOAD"), or "UNKNOWN" for a value this build does not know.
func NoSampleReasonName(r sandboxstatsv1.NoSampleReason) string {
	return upperName(r, "NO_SAMPLE_REASON_")
}

// KVMStateName is the label of a KVM source's state: "available",
// "partial", "unavailable", "not configured" or "unspecified" (also for a
// value this build does not know).
func KVMStateName(s sandboxstatsv1.KvmSourceState) string {
	return nameOr(s, "KVM_SOURCE_STATE_", " ", "unspecified")
}

// KVMCounterKindName is the label of a KVM counter's kind: "counter" (a
// cumulative one), "gauge", "peak" or "unspecified" (also for a value this
// build does not know).
func KVMCounterKindName(k sandboxstatsv1.KvmCounterKind) string {
	if k == sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE {
		return "counter"
	}
	return nameOr(k, "KVM_COUNTER_KIND_", " ", "unspecified")
}

// KVMSourceName is the label of a KVM source: "debugfs", "qmp" or
// "unspecified" (also for a value this build does not know).
func KVMSourceName(s sandboxstatsv1.KvmSource) string {
	return nameOr(s, "KVM_SOURCE_", " ", "unspecified")
}

// OutcomeName is the label value of an activation outcome: "checkpointed",
// "sandbox-dead", "oom-killed", "replaced", or "unknown" (also for 0).
func OutcomeName(o sandboxstatsv1.ActivationOutcome) string {
	if o == 0 {
		return "unknown"
	}
	return nameOr(o, "ACTIVATION_OUTCOME_", "-", "unknown")
}

// ProvenanceName is the label value of a final sample's provenance:
// "read-at-end", "last-good-poll", "none", or "unknown" (also for 0).
func ProvenanceName(p sandboxstatsv1.FinalProvenance) string {
	if p == 0 {
		return "unknown"
	}
	return nameOr(p, "FINAL_PROVENANCE_", "-", "unknown")
}

// nameOr is an enum value's name without prefix, lower case, with sep for
// '_'; unknown for a value this build does not know.
func nameOr(e protoreflect.Enum, prefix, sep, unknown string) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return unknown
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix)), "_", sep)
}

// upperName is an enum value's name without prefix, as the wire spells it;
// "UNKNOWN" for a value this build does not know.
func upperName(e protoreflect.Enum, prefix string) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return "UNKNOWN"
	}
	return strings.TrimPrefix(string(v.Name()), prefix)
}

// ContainerIDs are the ids of set, in order: a micro-VM's
// SandboxRef.container_ids for its SandboxRef.containers.
func ContainerIDs(set []*sandboxstatsv1.ContainerRef) []string {
	ids := make([]string, 0, len(set))
	for _, c := range set {
		ids = append(ids, c.GetId())
	}
	return ids
}

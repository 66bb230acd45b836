package api

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestWithErrorInfo: the detail written by hand is the bytes proto.Marshal
// writes for the same errdetails.ErrorInfo, and status.Details reads it as
// one (a client that links errdetails).
func TestWithErrorInfo(t *testing.T) {
	st := WithErrorInfo(status.New(codes.Unavailable, "refused"), "READ_TIMEOUT")
	want := &errdetails.ErrorInfo{Reason: "READ_TIMEOUT", Domain: ErrorDomain}
	wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	details := st.Proto().GetDetails()
	if len(details) != 1 || details[0].GetTypeUrl() != "type.googleapis.com/google.rpc.ErrorInfo" || !bytes.Equal(details[0].GetValue(), wantBytes) {
		t.Fatalf("details %v, want one ErrorInfo of bytes %x", details, wantBytes)
	}
	got := st.Details()
	if len(got) != 1 {
		t.Fatalf("Details() = %v", got)
	}
	if info, ok := got[0].(*errdetails.ErrorInfo); !ok || !proto.Equal(info, want) {
		t.Errorf("Details() = %v, want %v", got[0], want)
	}
	if st.Code() != codes.Unavailable || st.Message() != "refused" {
		t.Errorf("status %v", st)
	}
}

func TestReasonOf(t *testing.T) {
	withInfo := func(domain string) error {
		st, err := status.New(codes.FailedPrecondition, "actor mismatch").WithDetails(&errdetails.ErrorInfo{
			Domain: domain, Reason: Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH),
		})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"statsd error", withInfo(ErrorDomain), "ACTOR_MISMATCH"},
		{"another domain", withInfo("example.com"), ""},
		{"written by hand", WithErrorInfo(status.New(codes.Unavailable, "x"), "READ_TIMEOUT").Err(), "READ_TIMEOUT"},
		{"with metadata", withMetadata(t), "ACTOR_MISMATCH"},
		{"cut detail", cutDetail(t), ""},
		{"status without details", status.Error(codes.Unavailable, "refused"), ""},
		{"not a status", errors.New("plain"), ""},
		{"nil", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReasonOf(tc.err); got != tc.want {
				t.Errorf("ReasonOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// withMetadata is a statsd error whose ErrorInfo carries metadata, a
// field ReasonOf skips.
func withMetadata(t *testing.T) error {
	st, err := status.New(codes.FailedPrecondition, "x").WithDetails(&errdetails.ErrorInfo{
		Domain: ErrorDomain, Reason: "ACTOR_MISMATCH", Metadata: map[string]string{"actor_uid": "a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// cutDetail is a statsd error whose ErrorInfo bytes stop inside its reason.
func cutDetail(t *testing.T) error {
	st := WithErrorInfo(status.New(codes.Unavailable, "x"), "READ_TIMEOUT")
	p := st.Proto()
	p.Details[0].Value = p.Details[0].Value[:4]
	return status.FromProto(p).Err()
}

// TestNames: the label of every value, and what a value this build does not
// know (a newer daemon's) prints.
func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{SourceName(sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP), "cgroup"},
		{SourceName(sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT), "guest-agent"},
		{SourceName(sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED), "unspecified"},
		{SourceName(99), "unspecified"},
		{ClassName(sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR), "gvisor"},
		{ClassName(sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM), "microvm"},
		{ClassName(99), "unspecified"},
		{DriftKindName(sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD), "SANDBOX_DEAD"},
		{DriftKindName(99), "UNKNOWN"},
		{DriftEventTypeName(sandboxstatsv1.DriftEventType_DRIFT_EVENT_TYPE_CLEARED), "CLEARED"},
		{DriftEventTypeName(99), "UNKNOWN"},
		{NoSampleReasonName(sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NOT_MEASURABLE_YET), "NOT_MEASURABLE_YET"},
		{NoSampleReasonName(99), "UNKNOWN"},
		{KVMStateName(sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_NOT_CONFIGURED), "not configured"},
		{KVMStateName(99), "unspecified"},
		{KVMCounterKindName(sandboxstatsv1.KvmCounterKind_KVM_COUNTER_KIND_CUMULATIVE), "counter"},
		{KVMCounterKindName(99), "unspecified"},
		{KVMSourceName(sandboxstatsv1.KvmSource_KVM_SOURCE_QMP), "qmp"},
		{KVMSourceName(99), "unspecified"},
		{Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_READ_TIMEOUT), "READ_TIMEOUT"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

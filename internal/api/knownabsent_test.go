package api

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Every KnownAbsent value has its field and reason here, each the same as
// the comment in stats.proto says (the contract for clients in other
// languages), and KnownAbsentCode finds it back only by both.
func TestKnownAbsentTable(t *testing.T) {
	proto, err := os.ReadFile("../../proto/sandboxstats/v1/stats.proto")
	if err != nil {
		t.Fatal(err)
	}
	comments := enumComments(t, string(proto))
	// StatsWorkloadRequest.known_absent promises values 1 to 11: a value
	// added later needs a request field of its own (stats.proto).
	if n := len(sandboxstatsv1.KnownAbsent_name) - 1; n != 11 {
		t.Errorf("KnownAbsent has %d values; the request's known_absent covers 1 to 11: a new value needs a request field of its own", n)
	}
	for n, name := range sandboxstatsv1.KnownAbsent_name {
		code := sandboxstatsv1.KnownAbsent(n)
		if code == sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_UNSPECIFIED {
			continue
		}
		v := KnownAbsentValue(code)
		if strings.HasPrefix(v.GetField(), "known_absent ") {
			t.Errorf("%s has no entry in the table", name)
			continue
		}
		c := comments[name]
		if !strings.Contains(c, `field "`+v.GetField()+`"`) {
			t.Errorf("%s: comment %q does not name field %q", name, c, v.GetField())
		}
		if !strings.Contains(c, `reason "`+v.GetReason()+`"`) && !sameReasonAs(comments, c, v.GetReason()) {
			t.Errorf("%s: comment %q does not give reason %q", name, c, v.GetReason())
		}
		if got := KnownAbsentCode(v.GetField(), v.GetReason()); got != code {
			t.Errorf("KnownAbsentCode(%q, its reason) = %s, want %s", v.GetField(), got, name)
		}
		if got := KnownAbsentCode(v.GetField(), v.GetReason()+" "); got != sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_UNSPECIFIED {
			t.Errorf("KnownAbsentCode(%q, another reason) = %s, want none", v.GetField(), got)
		}
	}
}

// valueLine is a KnownAbsent value's line in stats.proto.
var valueLine = regexp.MustCompile(`^KNOWN_ABSENT_\w+ = \d+;$`)

// enumComments is the comment above each KnownAbsent value, its lines
// joined by spaces.
func enumComments(t *testing.T, proto string) map[string]string {
	t.Helper()
	body := proto[strings.Index(proto, "enum KnownAbsent {"):]
	body = body[:strings.Index(body, "\n}")]
	out := map[string]string{}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "//"):
			lines = append(lines, strings.TrimSpace(strings.TrimPrefix(l, "//")))
		case valueLine.MatchString(l):
			out[strings.Fields(l)[0]] = strings.Join(lines, " ")
			lines = nil
		}
	}
	return out
}

// sameReasonAs: comment c says "the reason of X" and X's comment gives
// reason.
func sameReasonAs(comments map[string]string, c, reason string) bool {
	_, other, ok := strings.Cut(c, "the reason of ")
	return ok && strings.Contains(comments[strings.TrimSpace(other)], `reason "`+reason+`"`)
}

// ExpandKnownAbsent puts the codes' values first, keeps the rest, names a
// code from a newer statsd by its number, and leaves no codes.
func TestExpandKnownAbsent(t *testing.T) {
	s := &sandboxstatsv1.WorkloadStatsSample{
		Absent:      []*sandboxstatsv1.AbsentValue{{Field: "cpu_usage_usec", Reason: "agent version unknown"}},
		KnownAbsent: []sandboxstatsv1.KnownAbsent{sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_AGENT_PRESSURE, 99},
	}
	ExpandKnownAbsent(s)
	want := &sandboxstatsv1.WorkloadStatsSample{Absent: []*sandboxstatsv1.AbsentValue{
		{Field: "pressure", Reason: WhyAgentNoPressure},
		{Field: "known_absent 99", Reason: "a KnownAbsent code this client does not know (statsd is newer): see proto/sandboxstats/v1/stats.proto"},
		{Field: "cpu_usage_usec", Reason: "agent version unknown"},
	}}
	if diff := cmp.Diff(want, s, protocmp.Transform()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	ExpandKnownAbsent(nil) // no sample: nothing to do
}

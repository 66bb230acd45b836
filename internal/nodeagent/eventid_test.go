package nodeagent

import (
	"regexp"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// eventAttr returns the string value of r's attribute key ("" when absent).
func eventAttr(r sdklog.Record, key string) string {
	v := ""
	r.WalkAttributes(func(kv attribute.KeyValue) bool {
		if string(kv.Key) == key {
			v = kv.Value.String()
			return false
		}
		return true
	})
	return v
}

// uids returns the log.record.uid of each record by kind and actor
// ("kind actor"; lost events by "lost").
func uids(t *testing.T, recs []sdklog.Record) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, r := range recs {
		k := eventAttr(r, attrKind) + " " + eventAttr(r, attrActorUID)
		out[k] = append(out[k], eventAttr(r, attrRecordUID))
	}
	return out
}

var uidFormat = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestEventUIDStable: an agent restarted that sends the same events again
// (the same sweeps applied by a second agent) gives each the same
// log.record.uid, so a consumer deduplicating by it sees each once; a
// periodic event of the same sample served twice is the same event; and
// every two events that are not the same (kinds, activations, samples,
// records) have different ids, each 32 hex digits.
func TestEventUIDStable(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	epoch := t0.Add(10 * time.Second)
	w1 := func(at time.Time, cpu uint64) *sandboxstatsv1.WorkloadStatsSample {
		s := sample("w1", cpu, 64<<20)
		s.EpochUnixNano, s.ObservedAtUnixNano = epoch.UnixNano(), at.UnixNano()
		return s
	}
	w1Again := w1(t0.Add(80*time.Second), 3_000_000)
	w1Again.EpochUnixNano = t0.Add(75 * time.Second).UnixNano() // restored: another activation of the same actor
	w2 := sample("w2", 1_000_000, 64<<20)
	w2.EpochUnixNano, w2.ObservedAtUnixNano = epoch.UnixNano(), t0.Add(20*time.Second).UnixNano()
	end := endedOf(w1(t0.Add(70*time.Second), 2_000_000), t0.Add(70*time.Second), 2_000_000)
	end.InstanceId, end.Sequence = "0123456789abcdef0123456789abcdef", 7
	sweeps := [][]sweep.DaemonResult{
		{okResult("/run/statsd/a.sock", w1(t0.Add(20*time.Second), 1_000_000), w2)},
		{okResult("/run/statsd/a.sock", w1(t0.Add(40*time.Second), 1_500_000), w2)},
		{{Socket: "/run/statsd/a.sock", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{w1Again, w2}, Ended: []*sandboxstatsv1.EndedActivation{end}}},
	}
	run := func() map[string][]string {
		h := newOTelHarness(t, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUs: 2}, 1)
		for i, s := range sweeps {
			h.m.Apply(s, t0.Add(time.Duration(20+30*i)*time.Second), time.Millisecond)
		}
		return uids(t, h.events.records())
	}
	first, again := run(), run()
	if len(first) == 0 || !mapsEqual(first, again) {
		t.Errorf("the same events sent again have other ids:\nfirst %v\nagain %v", first, again)
	}
	// w2's sample served again in the second and third sweeps: one
	// periodic event, sent twice.
	if p := first["periodic w2"]; len(p) != 2 || p[0] != p[1] {
		t.Errorf("w2's periodic events of one sample: ids %v, want the same twice", p)
	}
	// Every other pair differs.
	var all []string
	for k, ids := range first {
		if k == "periodic w2" {
			ids = ids[:1]
		}
		for _, id := range ids {
			if !uidFormat.MatchString(id) {
				t.Errorf("%s: id %q is not 32 hex digits", k, id)
			}
			all = append(all, id)
		}
	}
	slices.Sort(all)
	if n := len(slices.Compact(slices.Clone(all))); n != len(all) || n < 6 {
		t.Errorf("%d distinct ids among %d events: two different events share one (%v)", n, len(all), first)
	}
	// The id is of the event, not of the agent or the send.
	if finalUID(end) != finalUID(proto.Clone(end).(*sandboxstatsv1.EndedActivation)) {
		t.Error("a final's id changes with a copy of its record")
	}
	other := proto.Clone(end).(*sandboxstatsv1.EndedActivation)
	other.Sequence = 8 // the same activation recorded again: another record
	if finalUID(other) == finalUID(end) {
		t.Error("two records of one activation share a final's id")
	}
	if sampleUID(KindInitial, w2) == sampleUID(KindPeriodic, w2) || lostUID("i", 3, 5) == lostUID("i", 3, 6) {
		t.Error("an initial and a periodic of one sample, or two gaps, share an id")
	}
	// Moving a boundary between fields makes another id.
	if eventUID(KindLost, "ab", "c") == eventUID(KindLost, "a", "bc") {
		t.Error("fields are not told apart")
	}
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

package main

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// statsctl asks for KnownAbsent codes and shows every absent value with its
// reason all the same: the fixed ones expanded from their codes, the rest
// as statsd sent them.
func TestStatsShowsKnownAbsent(t *testing.T) {
	d := startDaemon(t)
	bindGolden(t, d)
	r := source.Reading{Kind: source.KindGuestAgent, Detail: "guest agent hvsock:///run/vm/clh.sock:1024", MemoryCurrentBytes: 100 << 20, MemoryWorkingSetBytes: 90 << 20}
	r.Absent = []source.Absent{
		{Field: "memory_signals.high_bytes", Reason: api.WhyAgentNoHigh},
		{Field: "cpu_throttling.throttled_usec", Reason: `container(s) web: agent "4.1.0" reads cpu.stat throttled_time`},
		{Field: "pressure", Reason: api.WhyAgentNoPressure},
		{Field: "network", Reason: api.WhyAgentNoNetwork},
	}
	d.src.set(r, nil)
	out, errOut, code := d.ctl(t, "stats", "--socket", "$STATS", "--actor-uid", "actor-7f3c", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Absent      []source.Absent `json:"absent"`
		KnownAbsent []string        `json:"known_absent"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(got.KnownAbsent) != 0 {
		t.Errorf("codes left unexpanded: %v", got.KnownAbsent)
	}
	byField := cmpopts.SortSlices(func(a, b source.Absent) bool { return a.Field < b.Field })
	if diff := cmp.Diff(r.Absent, got.Absent, byField); diff != "" {
		t.Errorf("absent values (-reading +shown):\n%s", diff)
	}
}

package nodeagent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// serveEnded makes d answer no sample, the records seqs of instance (each
// an activation of its own) and the ended log lowest..next.
func serveEnded(d *statsdfake.Daemon, instance string, lowest, next uint64, seqs ...uint64) {
	resp := &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		EndedLog: &sandboxstatsv1.EndedLog{InstanceId: instance, LowestSequence: lowest, NextSequence: next}}
	for _, n := range seqs {
		s := sample(fmt.Sprintf("%s-%s-%d", filepath.Base(d.Socket), instance, n), 1_000_000, 16<<20)
		e := endedOf(s, time.Now(), 1_000_000)
		e.InstanceId, e.Sequence = instance, n
		resp.Ended = append(resp.Ended, e)
	}
	d.SetResponse(resp)
}

// TestEndedGap: against fake statsd daemons, the agent counts the ended
// records a daemon dropped before it read them (the lowest sequence held
// above the highest read + 1) and emits one lost event per gap, naming the
// daemon, the instance and how many; the same gap seen again is not counted
// again; a new instance (a wiped state) is no gap, nor is the first sight
// of a daemon, nor records dropped after they were read.
func TestEndedGap(t *testing.T) {
	dir := t.TempDir()
	gappy := statsdfake.Start(t, filepath.Join(dir, "a-gappy.sock"))
	whole := statsdfake.Start(t, filepath.Join(dir, "b-whole.sock"))
	late := statsdfake.Start(t, filepath.Join(dir, "c-late.sock"))
	events := &recordingProcessor{}
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: 5 * time.Second, Concurrency: 2, Grace: time.Minute,
		OTel: &OTel{Meters: sdkmetric.NewMeterProvider(), Loggers: sdklog.NewLoggerProvider(sdklog.WithProcessor(events)), Distributions: NewDistributions()}}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	lost := func() float64 { return gather(t, a.reg)[metricEndedLost+"{}"] }
	lostEvents := func() []sdklog.Record {
		var out []sdklog.Record
		for _, r := range events.records() {
			if eventAttr(r, attrKind) == KindLost {
				out = append(out, r)
			}
		}
		return out
	}
	type step struct {
		name                 string
		set                  func()
		wantLost, wantEvents int
	}
	for _, st := range []step{
		{"first sight: what came before is not known", func() {
			serveEnded(gappy, "i1", 1, 3, 1, 2)
			serveEnded(whole, "w1", 1, 3, 1, 2)
			serveEnded(late, "l1", 10, 12, 10, 11) // 1..9 dropped before this agent started
		}, 0, 0},
		{"three records dropped unread", func() {
			serveEnded(gappy, "i1", 6, 8, 6, 7) // 3, 4, 5 never served to this agent
			serveEnded(whole, "w1", 3, 5, 3, 4) // 1, 2 dropped after they were read
		}, 3, 1},
		{"the same answer again", func() {}, 3, 1},
		{"records dropped after they were read, none held", func() {
			serveEnded(gappy, "i1", 8, 8)
			serveEnded(whole, "w1", 5, 5)
		}, 3, 1},
		{"a wipe: a new instance", func() {
			serveEnded(gappy, "i2", 4, 6, 4, 5) // its 1..3 unknowable: logged, not counted
		}, 3, 1},
		{"the new instance read on", func() {
			serveEnded(gappy, "i2", 5, 7, 5, 6)
			serveEnded(late, "l1", 12, 13, 12)
		}, 3, 1},
		{"a gap in the new instance", func() {
			serveEnded(gappy, "i2", 9, 10, 9) // 7, 8
		}, 5, 2},
	} {
		st.set()
		a.SweepOnce(ctx)
		if got, n := lost(), len(lostEvents()); got != float64(st.wantLost) || n != st.wantEvents {
			t.Fatalf("%s: %s = %v and %d lost events, want %d and %d", st.name, metricEndedLost, got, n, st.wantLost, st.wantEvents)
		}
	}
	evs := lostEvents()
	for i, want := range []struct {
		instance, records, from, to string
	}{{"i1", "3", "3", "5"}, {"i2", "2", "7", "8"}} {
		r := evs[i]
		got := [5]string{eventAttr(r, attrDaemon), eventAttr(r, attrInstance), eventAttr(r, attrLostRecords), eventAttr(r, attrLostFrom), eventAttr(r, attrLostTo)}
		if got != [5]string{gappy.Socket, want.instance, want.records, want.from, want.to} {
			t.Errorf("lost event %d: daemon, instance, records, from, to = %q, want %s %v", i, got, gappy.Socket, want)
		}
		if uid := eventAttr(r, attrRecordUID); !uidFormat.MatchString(uid) {
			t.Errorf("lost event %d: log.record.uid %q", i, uid)
		}
	}
}

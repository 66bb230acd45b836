package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestEndedBytesCapped: ended records with the largest final reasons a
// source's error can leave (each cut to maxFinalReasonBytes) fill the ended
// file past its byte cap: the oldest are dropped, the newest kept, the file
// on disk stays under the cap, and a restarted statsd loads every record
// kept (nothing moved aside as corrupt).
func TestEndedBytesCapped(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1_700_000_000, 0)
	config := func(src source.Source) Config {
		return Config{StateDir: dir, Now: func() time.Time { return now }, ReadTimeout: 200 * time.Millisecond,
			EndedMax: 1 << 20, EndedRetention: time.Hour, // neither the count nor the age: only the bytes
			Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) { return src, nil, nil }}
	}
	good := reading(3_000_000, 200<<20)
	good.Detail = "cgroup v2 /sys/fs/cgroup/statstest/a"
	good.MemoryPeakBytes = u64(300 << 20)

	// The records of earlier activations as statsd writes them: each read
	// well once and failed at its end with a reason cut to the bound;
	// together just under the cap.
	record := func(i int) *Ended {
		fr := good
		e := &Ended{Identity: Identity{ActorUID: fmt.Sprintf("earlier-%04d", i), TemplateNamespace: "tns", TemplateName: "tpl"},
			Class: source.ClassGVisor, EpochUnixNano: now.Add(-time.Minute).UnixNano() + int64(i), EndUnixNano: now.Add(-30 * time.Second).UnixNano(),
			Outcome: OutcomeCheckpointed, Provenance: ProvenanceLastGoodPoll, FinalAgeNanos: int64(time.Second),
			FinalReason: foreign.Bound(strings.Repeat("agent said: no ", maxFinalReasonBytes), maxFinalReasonBytes),
			Final:       &fr, FinalAtUnixNano: now.Add(-31 * time.Second).UnixNano(),
			Baseline: &Baseline{Kind: BaselineEpochStart, AtUnixNano: now.Add(-time.Minute).UnixNano()}}
		e.account(200<<20, true)
		return e
	}
	size := func(es []*Ended) int {
		b, err := encodeState(endedFile{Version: stateVersion, Ended: es})
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	one := size([]*Ended{record(0)})
	per := size([]*Ended{record(0), record(1)}) - one
	earlier := make([]*Ended, (maxEndedBytes-16<<10-(one-per))/per)
	for i := range earlier {
		earlier[i] = record(i)
	}
	b, err := encodeState(endedFile{Version: stateVersion, Ended: earlier})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxEndedBytes {
		t.Fatalf("the earlier records are %d bytes, over the cap already", len(b))
	}
	if err := os.WriteFile(filepath.Join(dir, endedFileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	src := &scriptedSource{r: good}
	s, err := NewStore(config(src))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Ended()); n != len(earlier) {
		t.Fatalf("loaded %d of the %d earlier records", n, len(earlier))
	}

	// Eight more, each polled once and then failing its final read with a
	// 960 KiB error.
	huge := errors.New(strings.Repeat("guest said <&> ", 64<<10))
	var ours []string
	for i := range 8 {
		actor := fmt.Sprint("actor-", i)
		ours = append(ours, actor)
		src.set(good, nil, false)
		if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: actor}, refA); err != nil {
			t.Fatal(err)
		}
		s.Bound(actor).Activation.Observe(good, now.UnixNano()) // the read path's poll
		src.set(source.Reading{}, fmt.Errorf("%w: %w", source.ErrNotMeasurable, huge), false)
		now = now.Add(time.Second)
		e, err := s.Release(context.Background(), actor)
		if err != nil {
			t.Fatal(err)
		}
		if e.Provenance != ProvenanceLastGoodPoll || len(e.FinalReason) > maxFinalReasonBytes+64 {
			t.Fatalf("record of %s: provenance %v, reason of %d bytes; want last-good-poll, a reason cut to about %d", actor, e.Provenance, len(e.FinalReason), maxFinalReasonBytes)
		}
		fi, err := os.Stat(filepath.Join(dir, endedFileName))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > maxEndedBytes {
			t.Errorf("after %s the ended file is %d bytes, over its %d-byte cap", actor, fi.Size(), maxEndedBytes)
		}
	}
	var got []string
	for _, e := range s.Ended() {
		got = append(got, e.Identity.ActorUID)
	}
	dropped := len(earlier) + len(ours) - len(got)
	if dropped <= 0 {
		t.Fatalf("nothing dropped: %d records kept", len(got))
	}
	var want []string
	for _, e := range earlier[dropped:] {
		want = append(want, e.Identity.ActorUID)
	}
	want = append(want, ours...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kept: not the oldest dropped (-want +got):\n%s", diff)
	}
	s.Close()

	again, err := NewStore(config(&scriptedSource{r: good}))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if aside, _ := filepath.Glob(filepath.Join(dir, endedFileName+".corrupt-*")); len(aside) != 0 {
		t.Errorf("the restarted store moved the ended file aside: %v", aside)
	}
	if n := len(again.Ended()); n != len(got) {
		t.Errorf("the restarted store has %d records, want the %d kept", n, len(got))
	}
	t.Logf("%d earlier records (%d bytes); %d added, each with a 960 KiB error; the %d oldest dropped, %d kept",
		len(earlier), len(b), len(ours), dropped, len(got))
}

package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// manualClock is a clock a test moves. Safe for concurrent use.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond) // epochs differ
	return c.now
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// ledgerStore opens a store on dir (memory only when "") with the given
// clock and caps, logging into log (nil: discarded).
func ledgerStore(t *testing.T, dir string, clock *manualClock, endedMax int, log *testenv.SyncBuffer) *Store {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	s, err := NewStore(Config{StateDir: dir, Now: clock.Now, Logger: logger, EndedMax: endedMax, EndedRetention: time.Minute,
		Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) {
			return &scriptedSource{r: reading(1_000, 1<<20)}, nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// endOne binds actor and checkpoints it: one ended record.
func endOne(t *testing.T, s *Store, actor string) *Ended {
	t.Helper()
	if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: actor}, refA); err != nil {
		t.Fatal(err)
	}
	e, err := s.Release(context.Background(), actor)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sequences(es []*Ended) []uint64 {
	var out []uint64
	for _, e := range es {
		out = append(out, e.Sequence)
	}
	return out
}

func newClock() *manualClock { return &manualClock{now: time.Unix(1_700_000_000, 0)} }

// TestSequenceAcrossRestart: a restarted statsd keeps its instance id and
// continues its sequence; a record whose end was written but whose cleared
// binding was not (statsd stopped between the two writes) keeps its number;
// an end whose write never happened (statsd stopped before it) gave no
// number out, and the next end takes it; no number is given twice.
func TestSequenceAcrossRestart(t *testing.T) {
	dir, clock := t.TempDir(), newClock()
	s := ledgerStore(t, dir, clock, 0, nil)
	instance := s.EndedLog().InstanceID
	if len(instance) != 32 {
		t.Fatalf("instance id %q, want 32 hex digits", instance)
	}
	given := map[uint64]string{}
	give := func(e *Ended) {
		t.Helper()
		if e.InstanceID != instance {
			t.Fatalf("record of %s from instance %q, want %q", e.Identity.ActorUID, e.InstanceID, instance)
		}
		if prev, ok := given[e.Sequence]; ok {
			t.Fatalf("sequence %d given to %s and to %s", e.Sequence, prev, e.Identity.ActorUID)
		}
		given[e.Sequence] = e.Identity.ActorUID
	}
	for i := range 3 {
		give(endOne(t, s, fmt.Sprint("actor-", i)))
	}
	s.Close()

	s = ledgerStore(t, dir, clock, 0, nil)
	if got := s.EndedLog(); got.InstanceID != instance || got.LowestSequence != 1 || got.NextSequence != 4 {
		t.Fatalf("after a restart: instance %q, sequences %d..%d; want %q, 1..4", got.InstanceID, got.LowestSequence, got.NextSequence, instance)
	}
	e := endOne(t, s, "actor-3")
	give(e)
	if e.Sequence != 4 {
		t.Fatalf("first record after the restart is %d, want 4", e.Sequence)
	}

	t.Run("stopped between the record's write and the binding's", func(t *testing.T) {
		if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: "actor-4"}, refA); err != nil {
			t.Fatal(err)
		}
		bindingBefore, _ := os.ReadFile(filepath.Join(dir, stateFileName))
		e, err := s.Release(context.Background(), "actor-4")
		if err != nil {
			t.Fatal(err)
		}
		give(e)
		s.Close()
		if err := os.WriteFile(filepath.Join(dir, stateFileName), bindingBefore, 0o600); err != nil {
			t.Fatal(err)
		}
		s = ledgerStore(t, dir, clock, 0, nil)
		if s.Bound("actor-4") != nil {
			t.Fatal("bound again though its end is recorded")
		}
		got := s.EndedLog()
		if last := got.Records[len(got.Records)-1]; last.Identity.ActorUID != "actor-4" || last.Sequence != e.Sequence || got.NextSequence != e.Sequence+1 {
			t.Fatalf("after the restart: last record %s #%d, next %d; want actor-4 #%d, next %d",
				last.Identity.ActorUID, last.Sequence, got.NextSequence, e.Sequence, e.Sequence+1)
		}
	})

	t.Run("stopped before the record's write", func(t *testing.T) {
		if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: "actor-5"}, refA); err != nil {
			t.Fatal(err)
		}
		before := map[string][]byte{}
		for _, name := range []string{stateFileName, endedFileName} {
			before[name], _ = os.ReadFile(filepath.Join(dir, name))
		}
		next := s.EndedLog().NextSequence
		// The end as far as a crash before its write lets it go: the
		// record built in memory (endActivation), never written, so never
		// answered nor published.
		_ = endActivation(context.Background(), s.Bound("actor-5"), OutcomeCheckpointed, false, clock.Now, time.Second)
		s.Close()
		for name, b := range before {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s = ledgerStore(t, dir, clock, 0, nil)
		if s.Bound("actor-5") == nil {
			t.Fatal("the activation whose end was never written is not bound after the restart")
		}
		e, err := s.Release(context.Background(), "actor-5")
		if err != nil {
			t.Fatal(err)
		}
		give(e)
		if e.Sequence != next {
			t.Errorf("the end after the restart is #%d, want #%d (no number was given out)", e.Sequence, next)
		}
	})

	t.Run("a write that fails gives no number out", func(t *testing.T) {
		if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: "actor-6"}, refA); err != nil {
			t.Fatal(err)
		}
		next := s.EndedLog().NextSequence
		// The state directory gone: every write fails (ENOENT), as a full
		// disk would.
		keep := dir + ".keep"
		if err := os.Rename(dir, keep); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(context.Background(), "actor-6"); err == nil {
			t.Fatal("a Release whose record could not be written succeeded")
		}
		if err := os.Rename(keep, dir); err != nil {
			t.Fatal(err)
		}
		if got := s.EndedLog().NextSequence; got != next {
			t.Fatalf("next sequence %d after a failed write, want still %d", got, next)
		}
		e, err := s.Release(context.Background(), "actor-6")
		if err != nil {
			t.Fatal(err)
		}
		give(e)
		if e.Sequence != next {
			t.Errorf("the end after the failed write is #%d, want #%d", e.Sequence, next)
		}
	})

	if diff := cmp.Diff([]uint64{1, 2, 3, 4, 5, 6, 7}, sequences(s.EndedLog().Records)); diff != "" {
		t.Errorf("records held (-want +got):\n%s", diff)
	}
}

// TestWipedStateIsANewInstance: a statsd whose state was wiped (or whose
// ended.json was moved aside as corrupt) is another instance, numbering
// from 1; a memory-only store is one per process.
func TestWipedStateIsANewInstance(t *testing.T) {
	dir, clock := t.TempDir(), newClock()
	s := ledgerStore(t, dir, clock, 0, nil)
	endOne(t, s, "actor-a")
	endOne(t, s, "actor-b")
	first := s.EndedLog().InstanceID
	s.Close()

	for name, wipe := range map[string]func() error{
		"wiped":   func() error { return os.RemoveAll(dir) },
		"corrupt": func() error { return os.WriteFile(filepath.Join(dir, endedFileName), []byte("{"), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			if err := wipe(); err != nil {
				t.Fatal(err)
			}
			s := ledgerStore(t, dir, clock, 0, nil)
			got := s.EndedLog()
			if got.InstanceID == first || got.NextSequence != 1 || got.LowestSequence != 1 || got.Evicted != (Evictions{}) {
				t.Fatalf("after the state was %s: instance %q (before %q), sequences %d..%d, evicted %+v; want a new instance from 1",
					name, got.InstanceID, first, got.LowestSequence, got.NextSequence, got.Evicted)
			}
			if e := endOne(t, s, "actor-c"); e.Sequence != 1 || e.InstanceID != got.InstanceID {
				t.Fatalf("first record: %q #%d", e.InstanceID, e.Sequence)
			}
			first = got.InstanceID
		})
	}

	t.Run("nothing written before the first end", func(t *testing.T) {
		// A fresh state directory gets no file until an activation ends (a
		// 4 KiB state file system keeps its one page for binding.json); a
		// restart before then is a new instance with nothing numbered.
		dir := t.TempDir()
		ledgerStore(t, dir, clock, 0, nil).Close()
		if _, err := os.Stat(filepath.Join(dir, endedFileName)); !os.IsNotExist(err) {
			t.Errorf("%s after a start without ends: %v; want none", endedFileName, err)
		}
	})
	t.Run("memory only", func(t *testing.T) {
		a, b := ledgerStore(t, "", clock, 0, nil).EndedLog(), ledgerStore(t, "", clock, 0, nil).EndedLog()
		if a.InstanceID == b.InstanceID || a.NextSequence != 1 {
			t.Errorf("two memory-only stores: %q and %q, next %d", a.InstanceID, b.InstanceID, a.NextSequence)
		}
	})
}

// TestEvictionsCounted: records dropped for --ended-max and for the
// retention are counted, and of those the ones no reader was served; each
// such record is logged once (one line per batch); the counts survive a
// restart, and a record past the retention is counted as soon as a read
// finds it so, and not again when it leaves the file.
func TestEvictionsCounted(t *testing.T) {
	dir, clock, log := t.TempDir(), newClock(), &testenv.SyncBuffer{}
	const warning = "ended records dropped before any reader was served them"
	s := ledgerStore(t, dir, clock, 3, log)
	e1 := endOne(t, s, "actor-1")
	e1.MarkServed()
	endOne(t, s, "actor-2")
	endOne(t, s, "actor-3")
	endOne(t, s, "actor-4") // drops actor-1 (served)
	endOne(t, s, "actor-5") // drops actor-2 (never served)
	got := s.EndedLog()
	if want := (Evictions{ByMax: 2, NeverServed: 1}); got.Evicted != want || got.LowestSequence != 3 || got.NextSequence != 6 {
		t.Fatalf("after 5 ends with --ended-max 3: evicted %+v, sequences %d..%d; want %+v, 3..6", got.Evicted, got.LowestSequence, got.NextSequence, want)
	}
	if n := strings.Count(log.String(), warning); n != 1 {
		t.Errorf("%d warnings for the one record dropped unserved, want 1", n)
	}
	for _, e := range got.Records[:2] {
		e.MarkServed() // actor-3, actor-4 read
	}
	endOne(t, s, "actor-6") // drops actor-3 (served): persists actor-4's serve
	s.Close()

	s = ledgerStore(t, dir, clock, 3, log)
	if got := s.EndedLog(); got.Evicted != (Evictions{ByMax: 3, NeverServed: 1}) {
		t.Fatalf("after a restart: evicted %+v, want by max 3, never served 1", got.Evicted)
	}
	// Past the retention: actor-4 (served), actor-5 and actor-6 (not).
	clock.add(2 * time.Minute)
	for range 2 { // a second read neither counts nor logs them again
		if got := s.EndedLog(); got.Evicted != (Evictions{ByMax: 3, ByRetention: 3, NeverServed: 3}) || len(got.Records) != 0 || got.LowestSequence != 7 {
			t.Fatalf("past the retention: evicted %+v, %d records, lowest %d; want 3 more by retention, 2 more never served, none, 7",
				got.Evicted, len(got.Records), got.LowestSequence)
		}
	}
	if n := strings.Count(log.String(), warning); n != 2 {
		t.Errorf("%d warnings, want 2 (one per batch)", n)
	}
	e7 := endOne(t, s, "actor-7") // removes them from the file
	if got := s.EndedLog(); got.Evicted != (Evictions{ByMax: 3, ByRetention: 3, NeverServed: 3}) || got.LowestSequence != e7.Sequence || e7.Sequence != 7 {
		t.Fatalf("once dropped from the file: evicted %+v, lowest %d, record #%d; want the same counts, 7", got.Evicted, got.LowestSequence, e7.Sequence)
	}
	if n := strings.Count(log.String(), warning); n != 2 {
		t.Errorf("%d warnings after the file dropped them, want still 2", n)
	}
	s.Close()
	if got := ledgerStore(t, dir, clock, 3, nil).EndedLog(); got.Evicted != (Evictions{ByMax: 3, ByRetention: 3, NeverServed: 3}) {
		t.Errorf("after a second restart: evicted %+v", got.Evicted)
	}

	t.Run("dropped for the file's size", func(t *testing.T) {
		s := ledgerStore(t, "", newClock(), 100, log)
		big := strings.Repeat("x", 40<<10)
		var records []*Ended
		for i := range 40 {
			records = append(records, &Ended{Identity: Identity{ActorUID: fmt.Sprint("old-", i)}, FinalReason: big, EndUnixNano: clockStart()})
		}
		s.commit.Lock()
		s.publish(nil, records)
		s.commit.Unlock()
		endOne(t, s, "actor-x")
		if got := s.EndedLog().Evicted; got.BySize == 0 || got.NeverServed != got.BySize {
			t.Errorf("40 records of 40 KiB and one more: evicted %+v; want some for the size, each never served", got)
		}
	})
}

func clockStart() int64 { return time.Unix(1_700_000_000, 0).UnixNano() }

// TestServedSurvivesRestart: a serve is persisted with the next write of
// the file; one since the last write is forgotten by a restart (the record
// is then counted never served when dropped: an overcount, never a miss).
func TestServedSurvivesRestart(t *testing.T) {
	dir, clock := t.TempDir(), newClock()
	s := ledgerStore(t, dir, clock, 0, nil)
	a := endOne(t, s, "actor-a")
	a.MarkServed()
	b := endOne(t, s, "actor-b") // writes a's serve
	b.MarkServed()               // not written before the restart
	s.Close()
	s = ledgerStore(t, dir, clock, 0, nil)
	var got []uint32
	for _, e := range s.EndedLog().Records {
		got = append(got, e.served.Load())
	}
	if diff := cmp.Diff([]uint32{served, unserved}, got); diff != "" {
		t.Errorf("serve states after a restart (-want +got):\n%s", diff)
	}
}

// TestOlderEndedFileNumbered: an ended.json of version 2 (or 1) has no
// numbering: its records are numbered from 1 in order under a new instance
// id, written back at version 3 at once (so the id survives the next
// restart), and the count continues after them. A version 3 file without
// next_sequence continues after its highest record.
func TestOlderEndedFileNumbered(t *testing.T) {
	const end = 1_700_000_000_000_000_000 // within the retention of newClock
	records := fmt.Sprintf(`{"identity": {"actor_uid": "actor-c"}, "class": 1, "epoch_unix_nano": 1, "end_unix_nano": %d, "outcome": 1, "provenance": 1, "cpu_usec": 700},`+
		`{"identity": {"actor_uid": "actor-d"}, "class": 1, "epoch_unix_nano": 2, "end_unix_nano": %d, "outcome": 1, "provenance": 1, "cpu_usec": 900}`, end, end)
	for _, version := range []int{1, 2} {
		t.Run(fmt.Sprint("version ", version), func(t *testing.T) {
			dir, clock := t.TempDir(), newClock()
			if err := os.WriteFile(filepath.Join(dir, endedFileName), fmt.Appendf(nil, `{"version": %d, "ended": [%s]}`, version, records), 0o600); err != nil {
				t.Fatal(err)
			}
			s := ledgerStore(t, dir, clock, 0, nil)
			got := s.EndedLog()
			if diff := cmp.Diff([]uint64{1, 2}, sequences(got.Records)); diff != "" || got.NextSequence != 3 || len(got.InstanceID) != 32 {
				t.Fatalf("numbered %v (-want +got:\n%s), next %d, instance %q", sequences(got.Records), diff, got.NextSequence, got.InstanceID)
			}
			var f endedFile
			b, _ := os.ReadFile(filepath.Join(dir, endedFileName))
			if err := json.Unmarshal(b, &f); err != nil || f.Version != endedVersion || f.InstanceID != got.InstanceID || f.NextSequence != 3 {
				t.Fatalf("written back: version %d, instance %q, next %d (%v); want %d, %q, 3", f.Version, f.InstanceID, f.NextSequence, err, endedVersion, got.InstanceID)
			}
			if e := endOne(t, s, "actor-e"); e.Sequence != 3 {
				t.Errorf("the first new record is #%d, want 3", e.Sequence)
			}
			s.Close()
			if again := ledgerStore(t, dir, clock, 0, nil).EndedLog(); again.InstanceID != got.InstanceID || again.NextSequence != 4 {
				t.Errorf("after a restart: instance %q, next %d; want %q, 4", again.InstanceID, again.NextSequence, got.InstanceID)
			}
		})
	}
	t.Run("version 3 without next_sequence", func(t *testing.T) {
		dir := t.TempDir()
		body := strings.Replace(records, `"cpu_usec": 700}`, `"cpu_usec": 700, "sequence": 8}`, 1)
		body = strings.Replace(body, `"cpu_usec": 900}`, `"cpu_usec": 900, "sequence": 9}`, 1)
		if err := os.WriteFile(filepath.Join(dir, endedFileName), fmt.Appendf(nil, `{"version": 3, "instance_id": "0123456789abcdef0123456789abcdef", "ended": [%s]}`, body), 0o600); err != nil {
			t.Fatal(err)
		}
		got := ledgerStore(t, dir, newClock(), 0, nil).EndedLog()
		if got.InstanceID != "0123456789abcdef0123456789abcdef" || got.LowestSequence != 8 || got.NextSequence != 10 {
			t.Errorf("instance %q, sequences %d..%d; want the file's, 8..10", got.InstanceID, got.LowestSequence, got.NextSequence)
		}
	})
	t.Run("version 3 out of order is corrupt", func(t *testing.T) {
		dir := t.TempDir()
		body := strings.Replace(records, `"cpu_usec": 700}`, `"cpu_usec": 700, "sequence": 9}`, 1)
		body = strings.Replace(body, `"cpu_usec": 900}`, `"cpu_usec": 900, "sequence": 8}`, 1)
		if err := os.WriteFile(filepath.Join(dir, endedFileName), fmt.Appendf(nil, `{"version": 3, "instance_id": "0123456789abcdef0123456789abcdef", "next_sequence": 10, "ended": [%s]}`, body), 0o600); err != nil {
			t.Fatal(err)
		}
		got := ledgerStore(t, dir, newClock(), 0, nil).EndedLog()
		if got.InstanceID == "0123456789abcdef0123456789abcdef" || len(got.Records) != 0 {
			t.Errorf("a file numbering out of order kept: instance %q, %d records", got.InstanceID, len(got.Records))
		}
		if aside, _ := filepath.Glob(filepath.Join(dir, endedFileName+".corrupt-*")); len(aside) != 1 {
			t.Errorf("moved aside: %v", aside)
		}
	})
}

package identity

// This file numbers the ended records: each gets its statsd instance's
// identity and the next sequence of that instance, both persisted with the
// records (ended.json), so a restart continues the count and a wiped state
// starts a new instance. It also counts the records dropped (for the
// retention, the count cap, the file's byte cap) and, of those, the ones no
// reader was ever served.

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
)

// Evictions counts the ended records an instance dropped, by why, and of
// those the ones never served to a reader. Persisted in ended.json.
type Evictions struct {
	ByRetention uint64 `json:"by_retention,omitempty"`
	ByMax       uint64 `json:"by_max,omitempty"`
	BySize      uint64 `json:"by_size,omitempty"`
	NeverServed uint64 `json:"never_served,omitempty"`
}

// ledger is the numbering of a store's ended records: replaced whole under
// Store.commit, published with the records it numbers (view.ledger).
type ledger struct {
	instanceID string
	next       uint64 // the sequence the next record gets; from 1
	evicted    Evictions
}

// newInstanceID is 128 random bits in hex.
func newInstanceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand: it crashes the program instead)
	return hex.EncodeToString(b[:])
}

func newLedger() *ledger { return &ledger{instanceID: newInstanceID(), next: 1} }

// The serve states of a record (Ended.served): not served yet, served, or
// dropped (or past the retention) before any reader was served it. Each
// moves only from unserved, once.
const (
	unserved uint32 = iota
	served
	evictedUnserved
)

// MarkServed records that an answer listed e (a StatsActiveWorkloads or
// ListEndedActivations answer: the answer to the lifecycle call that ended
// it does not count). Safe for concurrent use; it never blocks.
func (e *Ended) MarkServed() { e.served.CompareAndSwap(unserved, served) }

// settle fixes e's serve state as it leaves (or is found past the
// retention): never reports whether no reader was served it, fresh whether
// this call decided so (so it is logged once). From then on a late serve
// does not count, so the count only grows (it may count a record served in
// that instant, never miss one).
func (e *Ended) settle() (never, fresh bool) {
	fresh = e.served.CompareAndSwap(unserved, evictedUnserved)
	return e.served.Load() == evictedUnserved, fresh
}

// MarshalJSON writes e as its JSON fields, with "served": true once a
// reader was served it.
func (e *Ended) MarshalJSON() ([]byte, error) {
	type plain Ended
	return json.Marshal(struct {
		*plain
		Served bool `json:"served,omitempty"`
	}{(*plain)(e), e.served.Load() == served})
}

// UnmarshalJSON reads what MarshalJSON wrote (and records without "served").
func (e *Ended) UnmarshalJSON(b []byte) error {
	type plain Ended
	aux := struct {
		*plain
		Served bool `json:"served"`
	}{plain: (*plain)(e)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	if aux.Served {
		e.served.Store(served)
	}
	return nil
}

// EndedLog is the ended records as one instant's readers see them, with
// their numbering: what ListEndedActivations serves.
type EndedLog struct {
	// Records are those held and not past the retention, oldest first
	// (shared: do not modify).
	Records    []*Ended
	InstanceID string
	// LowestSequence is Records[0]'s sequence, or NextSequence when
	// Records is empty: every record below it was dropped.
	LowestSequence uint64
	NextSequence   uint64
	// Evicted counts the records dropped, those past the retention but not
	// yet removed from the state file included.
	Evicted Evictions
}

// EndedLog returns the ended records with their numbering, from one state.
// It never blocks and never writes a file; the first call to find records
// past the retention that no reader was served logs them (once).
func (s *Store) EndedLog() EndedLog {
	v := s.view.Load()
	held := v.heldFrom(s.cutoff())
	led := v.ledger
	out := EndedLog{Records: v.ended[held:], InstanceID: led.instanceID, NextSequence: led.next, Evicted: led.evicted}
	if len(out.Records) > 0 {
		out.LowestSequence = out.Records[0].Sequence
	} else {
		out.LowestSequence = led.next
	}
	var fresh unseenBatch
	for _, e := range v.ended[:held] {
		out.Evicted.ByRetention++
		never, isFresh := e.settle()
		if never {
			out.Evicted.NeverServed++
		}
		if isFresh {
			fresh.add(e, "retention")
		}
	}
	s.warnUnserved(led.instanceID, fresh)
	return out
}

// cutoff is the end time (unix nanoseconds) before which a record is past
// the retention.
func (s *Store) cutoff() int64 { return s.cfg.Now().Add(-s.cfg.EndedRetention).UnixNano() }

// heldFrom is the index of v's first record not past cutoff (len(v.ended)
// when none): records leave oldest first, so with a wall clock stepped back
// one after it may be older.
func (v *view) heldFrom(cutoff int64) int {
	for i, e := range v.ended {
		if e.EndUnixNano >= cutoff {
			return i
		}
	}
	return len(v.ended)
}

// unseenBatch gathers the records one change dropped before any reader was
// served them, for one warning.
type unseenBatch struct {
	records []*Ended
	why     map[string]int
}

func (u *unseenBatch) add(e *Ended, why string) {
	if u.why == nil {
		u.why = map[string]int{}
	}
	u.records = append(u.records, e)
	u.why[why]++
}

// warnUnserved logs records dropped before any reader was served them: one
// line per batch (each record is in one batch only: evict settles it once).
func (s *Store) warnUnserved(instanceID string, u unseenBatch) {
	if len(u.records) == 0 {
		return
	}
	actors := make([]string, 0, min(len(u.records), 8))
	for _, e := range u.records[:min(len(u.records), 8)] {
		actors = append(actors, e.Identity.ActorUID)
	}
	s.logger.Warn("ended records dropped before any reader was served them: their usage is lost to every poller",
		"records", len(u.records), "retention", u.why["retention"], "ended_max", u.why["ended-max"], "size", u.why["size"],
		"instance_id", instanceID, "first_sequence", u.records[0].Sequence, "last_sequence", u.records[len(u.records)-1].Sequence,
		"actor_uids", actors)
}

// ledgerOf makes the ledger of records loaded from a file of version
// version with the given numbering (instanceID "" and next 0 when the file
// has none): records without a sequence (a file older than version 3) are
// numbered from 1, in order; next is past the highest; a missing instance
// is made anew. It reports whether the file lacked the numbering (so it is
// written back).
func ledgerOf(records []*Ended, instanceID string, next uint64, evicted Evictions) (*ledger, bool) {
	led := &ledger{instanceID: instanceID, next: next, evicted: evicted}
	missing := instanceID == ""
	if missing {
		led.instanceID = newInstanceID()
	}
	var high uint64
	for _, e := range records {
		if e.Sequence == 0 {
			e.Sequence, missing = high+1, true
		}
		high = max(high, e.Sequence)
		e.InstanceID = led.instanceID
	}
	if led.next <= high {
		led.next, missing = high+1, true
	}
	return led, missing
}

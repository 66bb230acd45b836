package rate

import (
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// Refusal says why the Accountant charged nothing of a sample or an ended
// record it was given, or forgot one early.
type Refusal string

const (
	// RefusedGrowth: a counter grew more between two samples, or from the
	// last sample to the final (or, for bytes and counts, from the epoch
	// start to a head, or to a reset's new value), than its bound allows
	// in the time: CPUs x the time for CPU and stall time, one period a
	// millisecond, MaxBytesPerSecond, MaxCountsPerSecond. Only that
	// counter charges nothing; counted once per sample or record.
	RefusedGrowth Refusal = "growth"
	// RefusedAbsurd: a counter at or past absurdValue (2^62: 146,000 years
	// of CPU, 4 EiB).
	RefusedAbsurd Refusal = "absurd"
	// RefusedEndedEvicted: not a refusal of a sample: an ended record
	// forgotten before the horizon because MaxEnded were remembered (if
	// its daemon serves it again, it is charged again).
	RefusedEndedEvicted Refusal = "ended-evicted"
)

// Refusals are every Refusal, in the order Refused reports them.
var Refusals = []Refusal{RefusedGrowth, RefusedAbsurd, RefusedEndedEvicted}

// absurdValue: a raw counter at or past it is no real counter (a hostile
// or broken daemon's): its sample charges nothing.
const absurdValue = 1 << 62

// bodySlack widens the window a body's or a tail's growth is bounded by:
// a counter is read a little before or after its observed time.
const bodySlack = time.Second

// DefaultMaxEnded is the MaxEnded where zero: 65,536 charged records,
// about 10 MiB with uids at the 253-byte cut.
const DefaultMaxEnded = 1 << 16

// maxKeyUIDBytes is the longest actor uid an ActivationKey keeps whole:
// statsd's uids are at most 128 bytes; a longer one is a hostile daemon's
// and is cut (see keyUID).
const maxKeyUIDBytes = 253

// keyUIDHashBytes is how much of a cut key is the whole uid's hash: "#"
// and 32 hex digits (128 bits of SHA-256).
const keyUIDHashBytes = 1 + 32

// keyUID returns the actor uid an ActivationKey keeps: uid itself within
// maxKeyUIDBytes (a copy of none: the key shares the sample's string),
// else its first bytes cut as foreign text is ("...(+N bytes)") followed
// by "#" and a hash of the whole uid (a new string: the key never holds
// the daemon's whole one), at most maxKeyUIDBytes+24 bytes. Two distinct
// uids never share a key: the cut alone is not unique (uids of one length
// sharing their first bytes), the hash is; and a cut key, longer than
// maxKeyUIDBytes, is never a uid kept whole.
func keyUID(uid string) string {
	if len(uid) <= maxKeyUIDBytes {
		return uid
	}
	sum := sha256.Sum256([]byte(uid))
	return foreign.Bound(uid, maxKeyUIDBytes-keyUIDHashBytes) + "#" + hex.EncodeToString(sum[:16])
}

// refusals counts each Refusal; safe for concurrent use (a scrape reads
// them while a sweep charges).
type refusals [3]atomic.Uint64

func (r *refusals) add(why Refusal) {
	for i, w := range Refusals {
		if w == why {
			r[i].Add(1)
		}
	}
}

// Refused returns how many samples and records were refused, and ended
// records evicted, by Refusal (every Refusal, 0 included). Unlike the
// Accountant's other methods it is safe to call concurrently with them.
func (a *Accountant) Refused() map[Refusal]uint64 {
	m := make(map[Refusal]uint64, len(Refusals))
	for i, w := range Refusals {
		m[w] = a.refused[i].Load()
	}
	return m
}

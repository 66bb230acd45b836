package nodeagent

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// attrRecordUID is the semantic conventions' log.record.uid (opt-in,
// development): records with the same value are duplicates a consumer may
// drop. Every usage event carries one (eventUID).
const attrRecordUID = "log.record.uid"

// eventUID is a usage event's log.record.uid: the first 128 bits of the
// SHA-256 of its identity's fields, each length-prefixed (so no two lists
// of fields hash alike by moving a boundary), in hex: 32 characters,
// opaque. The identity is what stays the same when the same event is sent
// again and differs between two events: the kind and the activation (actor
// uid, source, epoch) for an initial; with the sample's observed_at for a
// periodic; with the record's instance id and sequence for a final; the
// daemon's instance and the sequences lost for a lost event. Nothing of
// the agent process (no clock, no counter) is in it, so another agent
// process sending the same event gives the same id.
func eventUID(kind string, fields ...string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, f := range append([]string{kind}, fields...) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		h.Write([]byte(f))
	}
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16])
}

// activationFields are an activation's fields of an event's uid: the actor
// uid as statsd sent it (not cut: two uids alike in their first 253 bytes
// are two activations), the source and the epoch.
func activationFields(actorUID string, src sandboxstatsv1.StatsSource, epoch int64) []string {
	return []string{actorUID, strconv.Itoa(int(src)), strconv.FormatInt(epoch, 10)}
}

// sampleUID is the uid of an initial or periodic event of s: a periodic's
// names its sample (observed_at), an initial's its activation alone (an
// agent restarted sends the same initial again: a duplicate).
func sampleUID(kind string, s *sandboxstatsv1.WorkloadStatsSample) string {
	f := activationFields(s.GetActorUid(), s.GetSource(), s.GetEpochUnixNano())
	if kind == KindPeriodic {
		f = append(f, strconv.FormatInt(s.GetObservedAtUnixNano(), 10))
	}
	return eventUID(kind, f...)
}

// finalUID is the uid of e's final event: its activation and the record's
// identity (instance id and sequence; empty and 0 from a statsd older than
// them, the activation alone then).
func finalUID(e *sandboxstatsv1.EndedActivation) string {
	f := activationFields(e.GetIdentity().GetActorUid(), e.GetSource(), e.GetEpochUnixNano())
	return eventUID(KindFinal, append(f, e.GetInstanceId(), strconv.FormatUint(e.GetSequence(), 10))...)
}

// lostUID is the uid of a lost event: the records from to to of a statsd
// instance dropped before this agent read them.
func lostUID(instance string, from, to uint64) string {
	return eventUID(KindLost, instance, strconv.FormatUint(from, 10), strconv.FormatUint(to, 10))
}

package server

// This file pages the ended activations: a page holds the records after
// the one its token names, oldest first, as many as fit its budget.

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// pageKey names the last record a page carried: an activation (an actor's
// epoch). The next page starts after it or, once it is no longer kept, at
// the oldest record kept: records leave oldest first (for age, for
// --ended-max, for the state file's size), so when it has left, every
// record before it has left too. (With a wall clock stepped back, a record
// older in the list may outlive it for its age and be listed again: a
// reader dedupes by actor and epoch; none is skipped.)
type pageKey struct {
	actorUID string
	epoch    int64
}

// tokenPrefix versions the token's text.
const tokenPrefix = "e1:"

// maxTokenField is more than a page token and the answer's ended log take
// on the wire (the token's tag and length, and base64 of the prefix, an
// epoch and a 128-byte actor uid: 204 bytes; the log's tag and length, a
// 32-digit instance id and six counters with their tags: at most 102
// bytes); a page's records leave room for them.
const maxTokenField = 320

// errBadPageToken: a page token this service did not make.
var errBadPageToken = errors.New("not a page token of ListEndedActivations")

func (k pageKey) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenPrefix + strconv.FormatInt(k.epoch, 10) + ":" + k.actorUID))
}

// parsePageToken reads a token; "" is the first page (ok false).
func parsePageToken(tok string) (k pageKey, ok bool, err error) {
	if tok == "" {
		return pageKey{}, false, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || !strings.HasPrefix(string(raw), tokenPrefix) {
		return pageKey{}, false, errBadPageToken
	}
	epoch, actor, found := strings.Cut(string(raw)[len(tokenPrefix):], ":")
	if !found {
		return pageKey{}, false, errBadPageToken
	}
	if k.epoch, err = strconv.ParseInt(epoch, 10, 64); err != nil {
		return pageKey{}, false, errBadPageToken
	}
	if err := identity.ValidateActorUID(actor); err != nil {
		return pageKey{}, false, fmt.Errorf("%w: %w", errBadPageToken, err)
	}
	k.actorUID = actor
	return k, true, nil
}

// pageStart is where the page after k starts in list (oldest first): after
// k's record, or at the oldest when it is not there.
func pageStart(list []*identity.Ended, k pageKey, ok bool) int {
	if !ok {
		return 0
	}
	for i, e := range list {
		if e.Identity.ActorUID == k.actorUID && e.EpochUnixNano == k.epoch {
			return i + 1
		}
	}
	return 0
}

// servePage is endedPage for an answer: the records it carries count as
// served (identity.Ended.MarkServed), so dropping them later is no loss.
func servePage(list []*identity.Ended, start, budget int, field protowire.Number) ([]*sandboxstatsv1.EndedActivation, string) {
	out, token := endedPage(list, start, budget, field)
	for _, e := range list[start : start+len(out)] {
		e.MarkServed()
	}
	return out, token
}

// answerLog is the ended log of an answer whose records are ended, read
// from an earlier state than l: its lowest sequence is that of ended's
// first, or l's when ended is empty (any record added since numbers from
// where that state's next was; any dropped since was dropped).
func answerLog(l identity.EndedLog, ended []*identity.Ended) *sandboxstatsv1.EndedLog {
	if len(ended) > 0 {
		return endedLogToProto(l, ended[0].Sequence)
	}
	return endedLogToProto(l, l.LowestSequence)
}

// endedPage converts list[start:], oldest first, as many records as fit in
// budget bytes as entries of a repeated field numbered field (at least
// one, whatever its size: a record is bounded by capSample and identity's
// cuts), and returns them with the token of the next page ("" when none
// remains).
func endedPage(list []*identity.Ended, start, budget int, field protowire.Number) ([]*sandboxstatsv1.EndedActivation, string) {
	var (
		out  []*sandboxstatsv1.EndedActivation
		used int
	)
	for _, e := range list[start:] {
		rec := endedToProto(e)
		n := protowire.SizeTag(field) + protowire.SizeBytes(proto.Size(rec))
		if len(out) > 0 && used+n > budget {
			last := list[start+len(out)-1]
			return out, pageKey{actorUID: last.Identity.ActorUID, epoch: last.EpochUnixNano}.token()
		}
		out, used = append(out, rec), used+n
	}
	return out, ""
}

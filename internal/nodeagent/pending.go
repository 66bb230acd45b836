package nodeagent

import (
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// maxPendingEvents bounds the events kept for sending again after a
// restart: the OTLP queue's default count. Past it the oldest are
// forgotten (and logged): they may still be sent by this process.
const maxPendingEvents = 8192

// pendingEvent is a usage event emitted and not yet settled (taken or
// refused by the collector, or dropped by a full queue): with --state-dir
// it is kept in the state file and emitted again, the same record with
// the same log.record.uid, after a restart.
type pendingEvent struct {
	UID          string       `json:"uid"`
	TimeUnixNano int64        `json:"time_unix_nano"`
	Attrs        []storedAttr `json:"attributes"`
}

// storedAttr is one attribute of a pending event. Type: s (string), i
// (int64), f (float64), b (bool).
type storedAttr struct {
	Key  string  `json:"k"`
	Type string  `json:"t"`
	S    string  `json:"s,omitempty"`
	I    int64   `json:"i,omitempty"`
	F    float64 `json:"f,omitempty"`
	B    bool    `json:"b,omitempty"`
}

func storedAttrs(kv []attribute.KeyValue) []storedAttr {
	out := make([]storedAttr, 0, len(kv))
	for _, a := range kv {
		e := storedAttr{Key: string(a.Key)}
		switch a.Value.Type() {
		case attribute.STRING:
			e.Type, e.S = "s", a.Value.AsString()
		case attribute.INT64:
			e.Type, e.I = "i", a.Value.AsInt64()
		case attribute.FLOAT64:
			if f := a.Value.AsFloat64(); !math.IsNaN(f) && !math.IsInf(f, 0) { // JSON has no NaN
				e.Type, e.F = "f", f
			}
		case attribute.BOOL:
			e.Type, e.B = "b", a.Value.AsBool()
		}
		if e.Type != "" {
			out = append(out, e)
		}
	}
	return out
}

func (ev pendingEvent) keyValues() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, len(ev.Attrs))
	for _, a := range ev.Attrs {
		switch a.Type {
		case "s":
			kv = append(kv, attribute.String(a.Key, a.S))
		case "i":
			kv = append(kv, attribute.Int64(a.Key, a.I))
		case "f":
			kv = append(kv, attribute.Float64(a.Key, a.F))
		case "b":
			kv = append(kv, attribute.Bool(a.Key, a.B))
		}
	}
	return kv
}

// pendingEvents are the events emitted and not settled, oldest first.
// Safe for concurrent use: the OTLP pipeline settles them from its own
// goroutine (and from an emit, when its queue is full).
type pendingEvents struct {
	mu      sync.Mutex
	byUID   map[string]pendingEvent
	order   []string // oldest first; may hold settled uids (skipped)
	dropped int      // forgotten past maxPendingEvents since the last take
}

func newPendingEvents() *pendingEvents { return &pendingEvents{byUID: map[string]pendingEvent{}} }

// add keeps ev until it is settled; an event already pending (sent again)
// keeps its place.
func (p *pendingEvents) add(ev pendingEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.byUID[ev.UID]; ok {
		return
	}
	p.byUID[ev.UID] = ev
	p.order = append(p.order, ev.UID)
	for len(p.byUID) > maxPendingEvents {
		if _, ok := p.byUID[p.order[0]]; ok {
			delete(p.byUID, p.order[0])
			p.dropped++
		}
		p.order = p.order[1:]
	}
	p.compact()
}

// compact drops the settled uids from order once they are most of it.
func (p *pendingEvents) compact() {
	if len(p.order) <= 2*len(p.byUID)+64 {
		return
	}
	keep := make([]string, 0, len(p.byUID))
	for _, u := range p.order {
		if _, ok := p.byUID[u]; ok {
			keep = append(keep, u)
		}
	}
	p.order = keep
}

// settle forgets the events with these uids: the collector took or
// refused them, or a full queue dropped them.
func (p *pendingEvents) settle(uids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range uids {
		delete(p.byUID, u)
	}
	p.compact()
}

// list returns the pending events, oldest first, and how many were
// forgotten past the bound since the last list.
func (p *pendingEvents) list() (evs []pendingEvent, dropped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	evs = make([]pendingEvent, 0, len(p.byUID))
	seen := make(map[string]bool, len(p.byUID))
	for _, u := range p.order {
		if ev, ok := p.byUID[u]; ok && !seen[u] {
			seen[u] = true
			evs = append(evs, ev)
		}
	}
	dropped, p.dropped = p.dropped, 0
	return evs, dropped
}

// resendPending emits again every event a previous process left pending
// (restored from the state file): the same records, the same uids.
func (o *otelMetrics) resendPending(evs []pendingEvent, now time.Time) {
	for _, ev := range evs {
		o.emit(time.Unix(0, ev.TimeUnixNano), now, ev.keyValues())
	}
}

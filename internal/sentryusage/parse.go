package sentryusage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// wireReply is urpc's callResult as the sentry writes it, its result
// runsc's EventOut: one value, decoded in one pass (decodeReply).
type wireReply struct {
	Success *bool         `json:"success"`
	Err     string        `json:"err"`
	Result  *wireEventOut `json:"result"`
}

// wireEventOut is runsc's boot.EventOut, only the fields that carry data;
// pointers tell absent from zero.
type wireEventOut struct {
	Event          *wireEvent        `json:"event"`
	ContainerUsage map[string]uint64 `json:"containerUsage"`
}

// wireEvent is EventOut's event: runsc's Event of type "stats".
type wireEvent struct {
	Type string    `json:"type"`
	ID   string    `json:"id"`
	Data wireStats `json:"data"`
}

// wireStats is the event's data, the figures statsd reads.
type wireStats struct {
	CPU struct {
		Usage struct {
			Total *uint64 `json:"total"`
		} `json:"usage"`
	} `json:"cpu"`
	Memory struct {
		Usage struct {
			Usage *uint64 `json:"usage"`
		} `json:"usage"`
	} `json:"memory"`
	Pids struct {
		Current *uint64 `json:"current"`
	} `json:"pids"`
}

// replyError is what parseReply finds wrong: a sentinel, what, and the
// cause; Read adds the socket and the container.
type replyError struct {
	sentinel error
	what     string
	cause    error
}

func (e *replyError) Error() string {
	if e.cause == nil {
		return fmt.Sprintf("%v: %s", e.sentinel, e.what)
	}
	return fmt.Sprintf("%v: %s: %v", e.sentinel, e.what, e.cause)
}

func (e *replyError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// wantsNoArg reports whether err is the sentry refusing a container id as
// Event's argument: runsc before release-20230731, whose Event takes
// *struct{} (observed: "json: cannot unmarshal string into Go value of type
// struct {}").
func wantsNoArg(err error) bool {
	return errors.Is(err, ErrRemote) && strings.Contains(err.Error(), "cannot unmarshal string into Go value of type struct")
}

// parseReply parses one whole reply to encodeRequest(d, q.ContainerID). It
// is pure: b is the whole reply, already bounded; white space may follow
// the value, nothing else. Errors are *replyError.
func parseReply(b []byte, d Dialect, q Query) (Usage, error) {
	rep, dec, err := decodeValue(bytes.NewReader(b), len(b), "not a urpc reply ")
	if err == nil && dec.More() {
		err = &replyError{ErrMalformed, "not a urpc reply: bytes after the JSON value", nil}
	}
	if err != nil {
		if _, ok := err.(*replyError); !ok { // cut short: not a whole value
			err = &replyError{ErrMalformed, "not a urpc reply " + excerpt(b, err), err}
		}
		return Usage{}, err
	}
	return checkReply(rep, d, q)
}

// decodeReply reads and decodes one reply of at most max bytes from r: the
// framing (urpc has no length prefix: the value's end is its closing brace)
// and the decoding in one pass, into only the fields used. A value past
// max is ErrTooLarge, bytes that cannot begin or continue a JSON value or a
// value of another shape ErrMalformed (as *replyError); a connection
// closed before a whole value is errClosedEmpty or io.ErrUnexpectedEOF;
// anything else is the reader's error. trailing says bytes came after the
// value in the same reads: nothing the sentry should send (urpc writes one
// value a call, no newline).
func decodeReply(r io.Reader, max int) (rep wireReply, trailing bool, err error) {
	rep, dec, err := decodeValue(r, max, "not JSON ")
	if err != nil {
		return wireReply{}, false, err
	}
	n, _ := dec.Buffered().Read(make([]byte, 1))
	return rep, n > 0, nil
}

// decodeValue is decodeReply's one pass; syntax names a syntax error's
// message ("not JSON " on the wire). It returns the decoder, whose buffer
// holds what came after the value.
func decodeValue(r io.Reader, max int, syntax string) (wireReply, *json.Decoder, error) {
	lr := &io.LimitedReader{R: r, N: int64(max) + 1}
	seen := &recorder{r: lr} // for an error's excerpt
	dec := json.NewDecoder(seen)
	var rep wireReply
	err := dec.Decode(&rep)
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case err == nil || errors.As(err, &te):
		// A whole value was read (a type error is found after it).
		if dec.InputOffset() > int64(max) {
			return wireReply{}, nil, &replyError{ErrTooLarge, fmt.Sprintf("more than %d bytes", max), nil}
		}
		if err == nil {
			return rep, dec, nil
		}
		if f, ok := strings.CutPrefix(te.Field, "result"); ok && (f == "" || f[0] == '.') {
			if rep.Success != nil && !*rep.Success {
				return rep, dec, nil // a refusal: its result is not read
			}
			te.Field = strings.TrimPrefix(f, ".")
			return wireReply{}, nil, &replyError{ErrMalformed, "result is not an EventOut " + excerpt(nil, te), te}
		}
		return wireReply{}, nil, &replyError{ErrMalformed, "not a urpc reply " + excerpt(nil, te), te}
	case lr.N <= 0 && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return wireReply{}, nil, &replyError{ErrTooLarge, fmt.Sprintf("more than %d bytes", max), nil}
	case errors.As(err, &se):
		return wireReply{}, nil, &replyError{ErrMalformed, syntax + excerpt(seen.b, err), err}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if len(seen.b) == 0 {
			return wireReply{}, nil, errClosedEmpty
		}
		return wireReply{}, nil, fmt.Errorf("closed after %d bytes: %w", len(seen.b), io.ErrUnexpectedEOF)
	}
	return wireReply{}, nil, err
}

// recorder is a Reader that keeps what it read (at most the reply's cap:
// its reader is limited).
type recorder struct {
	r io.Reader
	b []byte
}

func (c *recorder) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.b = append(c.b, p[:n]...)
	return n, err
}

// checkReply turns a decoded reply to encodeRequest(d, q.ContainerID) into
// a Usage. Errors are *replyError.
func checkReply(r wireReply, d Dialect, q Query) (Usage, error) {
	if r.Success == nil {
		return Usage{}, &replyError{ErrMalformed, `no "success" in the reply`, nil}
	}
	if !*r.Success {
		return Usage{}, &replyError{ErrRemote, foreign.Quote(r.Err), nil}
	}
	if r.Result == nil || r.Result.Event == nil {
		return Usage{}, &replyError{ErrMalformed, `no "event" in result`, nil}
	}
	out := r.Result
	ev := out.Event
	if ev.Type != "stats" {
		return Usage{}, &replyError{ErrMalformed, "event type " + foreign.Quote(ev.Type) + `, want "stats"`, nil}
	}
	if ev.ID != "" && ev.ID != q.ContainerID {
		return Usage{}, &replyError{ErrWrongContainer, "event.id " + foreign.Quote(ev.ID), nil}
	}
	if len(out.ContainerUsage) > MaxContainers {
		return Usage{}, &replyError{ErrMalformed, fmt.Sprintf("containerUsage names %d containers (at most %d)", len(out.ContainerUsage), MaxContainers), nil}
	}

	u := Usage{Dialect: d, ContainerCPU: ev.Data.CPU.Usage.Total, MemoryBytes: ev.Data.Memory.Usage.Usage, Pids: ev.Data.Pids.Current}
	if u.MemoryBytes != nil {
		u.Memory = MemorySplitOrOwn
		if d == DialectNoArg {
			u.Memory = MemorySandboxTotal
		}
	}
	u.PidsSandboxWide = u.Pids != nil && d == DialectNoArg
	known := func(k string) bool { return len(q.Containers) == 0 || slices.Contains(q.Containers, k) }
	if len(q.Containers) > 16 { // a pod has a handful; past that, a set
		set := make(map[string]bool, len(q.Containers))
		for _, c := range q.Containers {
			set[c] = true
		}
		known = func(k string) bool { return set[k] }
	}
	var foreignKeys []string
	for k, v := range out.ContainerUsage {
		if validID(k) != nil || !known(k) {
			foreignKeys = append(foreignKeys, k)
			continue
		}
		if u.CPU == nil {
			u.CPU = make(map[string]uint64, len(out.ContainerUsage))
		}
		u.CPU[k] = v
	}
	if len(foreignKeys) > 0 {
		slices.Sort(foreignKeys)
		u.ForeignCount = len(foreignKeys)
		for _, k := range foreignKeys[:min(len(foreignKeys), maxForeignKept)] {
			u.Foreign = append(u.Foreign, foreign.Text(k))
		}
	}
	return u, nil
}

// excerpt names where in b a JSON error is: the bytes around a syntax
// error's offset, or the field a type error is in, quoted as foreign text.
func excerpt(b []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		to := min(int(se.Offset)+16, len(b))
		from := min(max(int(se.Offset)-16, 0), to)
		return fmt.Sprintf("at byte %d near %s", se.Offset, foreign.QuoteBytes(b[from:to]))
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("at field %s (%s where %s goes)", foreign.Quote(te.Field), foreign.Quote(te.Value), te.Type)
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return "starting " + foreign.QuoteBytes(b)
}

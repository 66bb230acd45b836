package sentryusage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// wireReply is urpc's callResult as the sentry writes it.
type wireReply struct {
	Success *bool           `json:"success"`
	Err     string          `json:"err"`
	Result  json.RawMessage `json:"result"`
}

// wireEventOut is runsc's boot.EventOut, only the fields that carry data;
// pointers tell absent from zero.
type wireEventOut struct {
	Event *struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Data struct {
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
		} `json:"data"`
	} `json:"event"`
	ContainerUsage map[string]uint64 `json:"containerUsage"`
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

// parseReply parses one reply to encodeRequest(d, q.ContainerID). It is
// pure: b is the whole reply, already bounded. Errors are *replyError.
func parseReply(b []byte, d Dialect, q Query) (Usage, error) {
	var r wireReply
	if err := strictUnmarshal(b, &r); err != nil {
		return Usage{}, &replyError{ErrMalformed, "not a urpc reply " + excerpt(b, err), err}
	}
	if r.Success == nil {
		return Usage{}, &replyError{ErrMalformed, `no "success" in ` + foreign.QuoteBytes(b), nil}
	}
	if !*r.Success {
		return Usage{}, &replyError{ErrRemote, foreign.Quote(r.Err), nil}
	}
	var out wireEventOut
	if err := strictUnmarshal(r.Result, &out); err != nil {
		return Usage{}, &replyError{ErrMalformed, "result is not an EventOut " + excerpt(r.Result, err), err}
	}
	if out.Event == nil {
		return Usage{}, &replyError{ErrMalformed, `no "event" in result ` + foreign.QuoteBytes(r.Result), nil}
	}
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
	var known map[string]bool
	if len(q.Containers) > 0 {
		known = make(map[string]bool, len(q.Containers))
		for _, c := range q.Containers {
			known[c] = true
		}
	}
	var foreignKeys []string
	for k, v := range out.ContainerUsage {
		if validID(k) != nil || (known != nil && !known[k]) {
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

// strictUnmarshal is json.Unmarshal of exactly one value (trailing bytes
// other than white space are an error).
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("bytes after the JSON value")
	}
	return nil
}

// excerpt names where in b a JSON error is: the bytes around a syntax
// error's offset, or the field a type error is in, quoted as foreign text.
func excerpt(b []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		from := max(int(se.Offset)-16, 0)
		to := min(int(se.Offset)+16, len(b))
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

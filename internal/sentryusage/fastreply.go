// This file decodes the common reply by hand: a urpc reply of one read,
// every field statsd uses plain (no escape, no duplicate, no type error),
// decoded into wireReply exactly as encoding/json would (FuzzFastReply
// holds it to encoding/json on every input it accepts). Anything else, and
// any reply not whole in the first read, goes to encoding/json
// (decodeValue), whose errors and framing are the reference. encoding/json
// took about 21 µs of a 3-container reply (half scanning, half reflection).

package sentryusage

import (
	"bytes"
	"io"
	"sync"
	"unicode/utf8"
)

// fastBufBytes is the buffer of a reply's first read: a reply of a pod of a
// few containers is 0.3 to 1 KiB; a larger one goes on with encoding/json.
const fastBufBytes = 4 << 10

var fastBufs = sync.Pool{New: func() any { return new([fastBufBytes]byte) }}

// maxFastDepth is how deep a value the hand decoder skips; a deeper one
// (valid JSON to 10000 levels) goes to encoding/json.
const maxFastDepth = 64

// decodeReplyFast is decodeReply: one read of r, decoded by hand when it
// holds a whole reply the hand decoder takes; else encoding/json decodes
// what was read and the rest of r.
func decodeReplyFast(r io.Reader, max int) (wireReply, bool, error) {
	bp := fastBufs.Get().(*[fastBufBytes]byte)
	defer fastBufs.Put(bp)
	buf := bp[:min(max+1, fastBufBytes)]
	n, err := r.Read(buf)
	if err == nil && n <= max {
		if rep, end, ok := fastReply(buf[:n]); ok {
			return rep, end < n, nil
		}
	}
	// Copied: the buffer goes back to the pool before encoding/json's
	// error excerpts are made.
	read := bytes.NewReader(bytes.Clone(buf[:n]))
	rest := r
	if err != nil {
		rest = errReader{err}
	}
	return decodeReply(io.MultiReader(read, rest), max)
}

// errReader is the first read's error, given again to encoding/json.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// fastReply decodes the reply at the start of b (white space may come
// before it) and returns where it ends; ok false says the hand decoder does
// not take it (not whole, not plain, not JSON, or not a reply): encoding/json
// must.
func fastReply(b []byte) (rep wireReply, end int, ok bool) {
	d := fastDec{b: b}
	d.ws()
	if d.i >= len(b) || b[d.i] != '{' {
		return wireReply{}, 0, false
	}
	ok = d.object([]string{"success", "err", "result"}, func(f int) bool {
		switch f {
		case 0:
			return d.boolPtr(&rep.Success)
		case 1:
			return d.str(&rep.Err)
		default:
			if d.null() {
				return true
			}
			rep.Result = &wireEventOut{}
			return d.eventOut(rep.Result)
		}
	})
	if !ok {
		return wireReply{}, 0, false
	}
	return rep, d.i, true
}

// fastDec is the hand decoder's position in b.
type fastDec struct {
	b []byte
	i int
}

func (d *fastDec) eventOut(out *wireEventOut) bool {
	return d.object([]string{"event", "containerUsage"}, func(f int) bool {
		if f == 1 {
			return d.usageMap(&out.ContainerUsage)
		}
		if d.null() {
			return true
		}
		out.Event = &wireEvent{}
		return d.event(out.Event)
	})
}

func (d *fastDec) event(ev *wireEvent) bool {
	return d.object([]string{"type", "id", "data"}, func(f int) bool {
		switch f {
		case 0:
			return d.str(&ev.Type)
		case 1:
			return d.str(&ev.ID)
		}
		s := &ev.Data
		return d.object([]string{"cpu", "memory", "pids"}, func(f int) bool {
			switch f {
			case 0:
				return d.nested("usage", "total", &s.CPU.Usage.Total)
			case 1:
				return d.nested("usage", "usage", &s.Memory.Usage.Usage)
			}
			return d.object([]string{"current"}, func(int) bool { return d.u64Ptr(&s.Pids.Current) })
		})
	})
}

// nested decodes {outer: {inner: number}}, the rest skipped.
func (d *fastDec) nested(outer, inner string, v **uint64) bool {
	return d.object([]string{outer}, func(int) bool {
		return d.object([]string{inner}, func(int) bool { return d.u64Ptr(v) })
	})
}

// object decodes an object into a struct whose JSON names are names (null
// leaves it as it is): field is called for a key that is one of them (as
// encoding/json matches: exactly or ASCII case-insensitively), positioned
// at the value; other keys' values are skipped. A key twice (encoding/json
// merges or overwrites), a key with an escape or a byte past ASCII (it may
// fold to a name by Unicode's rules) is not taken.
func (d *fastDec) object(names []string, field func(int) bool) bool {
	if d.null() {
		return true
	}
	var seen uint32
	return d.members(func(key []byte) bool {
		f := -1
		for i, n := range names {
			if len(key) == len(n) && asciiEqualFold(key, n) {
				f = i
				break
			}
		}
		if f < 0 {
			for _, c := range key {
				if c >= utf8.RuneSelf {
					return false
				}
			}
			return d.skip(0)
		}
		if seen&(1<<f) != 0 {
			return false
		}
		seen |= 1 << f
		return field(f)
	})
}

// usageMap decodes containerUsage: null leaves it nil, an object makes the
// map (empty too); a key twice is the last value, as encoding/json's.
func (d *fastDec) usageMap(m *map[string]uint64) bool {
	if d.null() {
		return true
	}
	if d.i >= len(d.b) || d.b[d.i] != '{' {
		return false
	}
	*m = map[string]uint64{}
	return d.members(func(key []byte) bool {
		if !utf8.Valid(key) {
			return false // encoding/json puts U+FFFD for each bad byte
		}
		var v *uint64
		if !d.u64Ptr(&v) {
			return false
		}
		var x uint64
		if v != nil {
			x = *v // null: the element's zero, as encoding/json stores it
		}
		(*m)[string(key)] = x
		return true
	})
}

// members walks an object's members: member is given each plain key (no
// escape, no control byte), positioned at its value, and must consume it.
func (d *fastDec) members(member func(key []byte) bool) bool {
	if d.i >= len(d.b) || d.b[d.i] != '{' {
		return false
	}
	d.i++
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return true
	}
	for {
		key, ok := d.plain()
		if !ok {
			return false
		}
		d.ws()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return false
		}
		d.i++
		d.ws()
		if !member(key) {
			return false
		}
		if done, ok := d.after('}'); done || !ok {
			return ok
		}
	}
}

// after consumes what follows an object's member or an array's element: a
// comma (more follow) or end, the closing bracket (done).
func (d *fastDec) after(end byte) (done, ok bool) {
	d.ws()
	if d.i >= len(d.b) {
		return false, false
	}
	switch d.b[d.i] {
	case ',':
		d.i++
		d.ws()
		return false, true
	case end:
		d.i++
		return true, true
	}
	return false, false
}

// plain reads a string without escapes or control bytes and returns its
// bytes (aliasing b).
func (d *fastDec) plain() ([]byte, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return nil, false
	}
	for j := d.i + 1; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			s := d.b[d.i+1 : j]
			d.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// str decodes a string field: null leaves it, a plain valid UTF-8 string
// sets it.
func (d *fastDec) str(v *string) bool {
	if d.null() {
		return true
	}
	s, ok := d.plain()
	if !ok || !utf8.Valid(s) {
		return false
	}
	*v = string(s)
	return true
}

// boolPtr decodes a *bool field (null: nil).
func (d *fastDec) boolPtr(v **bool) bool {
	switch {
	case d.null():
		*v = nil
	case d.lit("true"):
		t := true
		*v = &t
	case d.lit("false"):
		f := false
		*v = &f
	default:
		return false
	}
	return true
}

// u64Ptr decodes a *uint64 field (null: nil): digits only, no leading
// zero, within a uint64 (encoding/json refuses a sign, a fraction or an
// exponent for a uint64).
func (d *fastDec) u64Ptr(v **uint64) bool {
	if d.null() {
		*v = nil
		return true
	}
	j := d.i
	var x uint64
	for ; j < len(d.b) && '0' <= d.b[j] && d.b[j] <= '9'; j++ {
		c := uint64(d.b[j] - '0')
		if x > (1<<64-1-c)/10 {
			return false
		}
		x = x*10 + c
	}
	if j == d.i || d.b[d.i] == '0' && j > d.i+1 || j >= len(d.b) {
		return false // none, a leading zero, or the end of b (a number may go on)
	}
	if c := d.b[j]; c == '.' || c == 'e' || c == 'E' {
		return false
	}
	d.i = j
	*v = &x
	return true
}

// skip consumes one JSON value of any kind, checked to be valid JSON.
func (d *fastDec) skip(depth int) bool {
	if d.i >= len(d.b) || depth > maxFastDepth {
		return false
	}
	switch c := d.b[d.i]; {
	case c == '{':
		return d.members(func([]byte) bool { return d.skip(depth + 1) })
	case c == '[':
		d.i++
		d.ws()
		if d.i < len(d.b) && d.b[d.i] == ']' {
			d.i++
			return true
		}
		for {
			if !d.skip(depth + 1) {
				return false
			}
			if done, ok := d.after(']'); done || !ok {
				return ok
			}
		}
	case c == '"':
		return d.skipString()
	case c == '-' || '0' <= c && c <= '9':
		return d.skipNumber()
	default:
		return d.lit("true") || d.lit("false") || d.lit("null")
	}
}

// skipString consumes a string, escapes checked as JSON's (any byte past
// ASCII is taken, valid UTF-8 or not, as encoding/json takes it).
func (d *fastDec) skipString() bool {
	for j := d.i + 1; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			d.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			j++
			if j >= len(d.b) {
				return false
			}
			switch d.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(d.b) {
					return false
				}
				for _, h := range d.b[j+1 : j+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}

// skipNumber consumes a number of JSON's grammar; one that reaches the end
// of b is not taken (it may go on in the next read).
func (d *fastDec) skipNumber() bool {
	j := d.i
	if d.b[j] == '-' {
		j++
	}
	digits := func() int {
		k := j
		for j < len(d.b) && '0' <= d.b[j] && d.b[j] <= '9' {
			j++
		}
		return j - k
	}
	if j >= len(d.b) {
		return false
	}
	if d.b[j] == '0' {
		j++
	} else if digits() == 0 {
		return false
	}
	if j < len(d.b) && d.b[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(d.b) && (d.b[j] == 'e' || d.b[j] == 'E') {
		j++
		if j < len(d.b) && (d.b[j] == '+' || d.b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return false
		}
	}
	if j >= len(d.b) {
		return false
	}
	d.i = j
	return true
}

// null consumes a null literal if one is next.
func (d *fastDec) null() bool { return d.lit("null") }

// lit consumes the literal s if it is next.
func (d *fastDec) lit(s string) bool {
	if !bytes.HasPrefix(d.b[d.i:], []byte(s)) {
		return false
	}
	d.i += len(s)
	return true
}

func (d *fastDec) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// asciiEqualFold reports whether key (ASCII) equals name (lower-case
// ASCII letters) but for case.
func asciiEqualFold(key []byte, name string) bool {
	for i := range len(key) {
		c := key[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		n := name[i]
		if 'A' <= n && n <= 'Z' {
			n += 'a' - 'A'
		}
		if c != n {
			return false
		}
	}
	return true
}

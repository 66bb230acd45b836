package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// Text from a response is the daemon's, and through it the guest's: a guest
// agent's error, a container id, an interface name. Printed raw, ESC ] 0 ;
// ... BEL retitles the operator's terminal, other escapes recolour or move
// it, and a newline forges a line of output. Every string a table prints
// from a response goes through safe (the renderers sanitize their message
// first, with sanitized); JSON output keeps the data and escapes what a
// terminal would act on (jsonSafe).

// maxPrinted bounds one string printed from a response, in bytes.
const maxPrinted = 1024

// unsafeRune reports whether r must not reach a terminal as is: C0 controls
// (newline and tab included: they would forge lines and columns), DEL, C1
// controls (U+0080-U+009F: 8-bit CSI, OSC...) and the bidirectional
// overrides that reorder what is shown.
func unsafeRune(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// safe returns s fit to print: every unsafe rune written as a Go escape
// (\x1b, \n, \u009b), invalid UTF-8 as \xNN, and the text cut after
// maxPrinted bytes, saying so.
func safe(s string) string {
	clean := len(s) <= maxPrinted && utf8.ValidString(s)
	for _, r := range s {
		if !clean || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if b.Len() >= maxPrinted {
			fmt.Fprintf(&b, "...(%d bytes cut)", len(s)-i)
			break
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// sanitized returns a copy of m with every string in it, at any depth, made
// safe.
func sanitized[M proto.Message](m M) M {
	if !m.ProtoReflect().IsValid() {
		return m
	}
	c := proto.Clone(m).(M)
	sanitizeMessage(c.ProtoReflect())
	return c
}

func sanitizeMessage(m protoreflect.Message) {
	m.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case f.IsList():
			l := v.List()
			for i := range l.Len() {
				switch f.Kind() {
				case protoreflect.StringKind:
					l.Set(i, protoreflect.ValueOfString(safe(l.Get(i).String())))
				case protoreflect.MessageKind, protoreflect.GroupKind:
					sanitizeMessage(l.Get(i).Message())
				}
			}
		case f.IsMap():
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				switch f.MapValue().Kind() {
				case protoreflect.StringKind:
					mp.Set(k, protoreflect.ValueOfString(safe(mv.String())))
				case protoreflect.MessageKind:
					sanitizeMessage(mv.Message())
				}
				return true
			})
		case f.Kind() == protoreflect.StringKind:
			m.Set(f, protoreflect.ValueOfString(safe(v.String())))
		case f.Kind() == protoreflect.MessageKind || f.Kind() == protoreflect.GroupKind:
			sanitizeMessage(v.Message())
		}
		return true
	})
}

// sanitizedWindow returns r with its strings (from the two host samples)
// made safe.
func sanitizedWindow(r rate.WindowReport) rate.WindowReport {
	r.GuestName = safe(r.GuestName)
	legends := make(map[string]string, len(r.Legends))
	for k, v := range r.Legends {
		legends[k] = safe(v)
	}
	r.Legends = legends
	rows := make([]rate.WindowRow, len(r.Rows))
	for i, row := range r.Rows {
		row.Layer, row.Name, row.Unit = safe(row.Layer), safe(row.Name), safe(row.Unit)
		rows[i] = row
	}
	r.Rows = rows
	findings := make([]string, len(r.Findings))
	for i, f := range r.Findings {
		findings[i] = safe(f)
	}
	r.Findings = findings
	return r
}

// jsonSafe returns JSON text b with DEL, the C1 controls and the
// bidirectional overrides, which JSON allows raw in strings, escaped
// (\u009b): the same data, nothing a terminal acts on. (The C0 controls are
// escaped by every JSON encoder.) Outside strings JSON is ASCII, so every
// such rune is inside one.
func jsonSafe(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r >= 0x7f && unsafeRune(r) }) {
		return b
	}
	var out bytes.Buffer
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r >= 0x7f && unsafeRune(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.Write(b[:n])
		}
		b = b[n:]
	}
	return out.Bytes()
}

// jsonSafeWriter passes each Write (one JSON value, as json.Encoder writes
// them) through jsonSafe.
type jsonSafeWriter struct{ w io.Writer }

func (j jsonSafeWriter) Write(b []byte) (int, error) {
	if _, err := j.w.Write(jsonSafe(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

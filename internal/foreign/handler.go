package foreign

import (
	"context"
	"fmt"
	"log/slog"
)

// MaxLogValue bounds each string of a log record under Handler: the
// message and every attribute value (an error, a string, anything printed
// with fmt), so that a record stays a few KiB however much foreign text
// reached it.
const MaxLogValue = 4 << 10

// Handler wraps h so that every record's message and attribute values are
// passed through Bound(s, MaxLogValue) before h sees them. It is the
// backstop of the edges that cut foreign text where it enters: a log line
// never grows with what a peer sends.
func Handler(h slog.Handler) slog.Handler { return boundedHandler{h} }

type boundedHandler struct{ h slog.Handler }

func (b boundedHandler) Enabled(ctx context.Context, l slog.Level) bool { return b.h.Enabled(ctx, l) }

func (b boundedHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Bound(r.Message, MaxLogValue), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(boundAttr(a))
		return true
	})
	return b.h.Handle(ctx, out)
}

func (b boundedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	bounded := make([]slog.Attr, len(as))
	for i, a := range as {
		bounded[i] = boundAttr(a)
	}
	return boundedHandler{b.h.WithAttrs(bounded)}
}

func (b boundedHandler) WithGroup(name string) slog.Handler {
	return boundedHandler{b.h.WithGroup(Bound(name, MaxBytes))}
}

func boundAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Bound(v.String(), MaxLogValue))
	case slog.KindGroup:
		g := v.Group()
		out := make([]any, len(g))
		for i, ga := range g {
			out[i] = boundAttr(ga)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		// fmt calls Error and String, and survives their panics.
		return slog.String(a.Key, Bound(fmt.Sprint(v.Any()), MaxLogValue))
	}
	return slog.Attr{Key: a.Key, Value: v}
}

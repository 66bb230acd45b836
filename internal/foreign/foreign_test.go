package foreign

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestQuote(t *testing.T) {
	long := strings.Repeat("x", 4<<20)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain agent error", "invalid container id", `"invalid container id"`},
		{"terminal title escape", "\x1b]0;pwned\x07boom", `"\x1b]0;pwned\aboom"`},
		{"newline and NUL", "a\nb\x00c", `"a\nb\x00c"`},
		{"bidi override", "abc\u202edef", `"abc\u202edef"`},
		{"invalid UTF-8", "a\xffb", `"a\xffb"`},
		{"printable unicode kept", "grüße", `"grüße"`},
		{"4 MB message cut", long, `"` + strings.Repeat("x", MaxBytes) + `"...(+4194048 bytes)`},
		{"cut at a rune boundary", strings.Repeat("x", MaxBytes-1) + "ü" + "tail", `"` + strings.Repeat("x", MaxBytes-1) + `"...(+6 bytes)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Quote(tc.in)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Quote (-want +got):\n%s", diff)
			}
			if got2 := QuoteBytes([]byte(tc.in)); got2 != got {
				t.Errorf("QuoteBytes = %q, Quote = %q", got2, got)
			}
		})
	}
}

func TestBound(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"clean and short is returned as is", "agent 3.9.0", 64, "agent 3.9.0"},
		{"escape replaced", "v\x1b]0;x\x07", 64, "v\uFFFD]0;x\uFFFD"},
		{"cut", "abcdef", 3, "abc...(+3 bytes)"},
		{"tab and newline replaced", "a\tb\nc", 64, "a\uFFFDb\uFFFDc"},
		{"invalid UTF-8 replaced", "a\xc3", 64, "a\uFFFD"},
		{"zero max", "abc", 0, "...(+3 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Bound(tc.in, tc.max)); diff != "" {
				t.Errorf("Bound (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandlerBoundsEveryString(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewTextHandler(&buf, nil)))
	huge := strings.Repeat("E", 12<<20) + "\x1b]0;title\x07"
	log.With("agent", huge).WithGroup("g").Warn(huge, "err", errors.New(huge), "s", huge, "list", []string{huge}, "n", 7)
	if buf.Len() > 6*MaxLogValue+1024 {
		t.Fatalf("log line is %d bytes, want a few KiB", buf.Len())
	}
	if bytes.ContainsRune(buf.Bytes(), 0x1b) {
		t.Fatalf("a raw ESC reached the log")
	}
	if !strings.Contains(buf.String(), "g.n=7") {
		t.Errorf("non-string attribute lost: %s", buf.String()[:200])
	}
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "ok", "\x1b]0;x\x07", "a\xffb", strings.Repeat("é", 200), "\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := Quote(s)
		if len(q) > 4*MaxBytes+32 {
			t.Fatalf("Quote gave %d bytes", len(q))
		}
		for i := 0; i < len(q); i++ {
			if c := q[i]; c < 0x20 || c == 0x7f {
				t.Fatalf("control byte %#x in %q", c, q)
			}
		}
		if !utf8.ValidString(q) {
			t.Fatalf("invalid UTF-8 out: %q", q)
		}
		b := Bound(s, 100)
		if len(b) > 3*100+24 || !utf8.ValidString(b) || strings.ContainsFunc(b, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("Bound(%q) = %q", s, b)
		}
		if len(s) <= 100 && clean(s) && b != s {
			t.Fatalf("clean short text changed: %q -> %q", s, b)
		}
	})
}

func TestHandlerKeepsLevel(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	log.Info("dropped")
	if buf.Len() != 0 || log.Handler().Enabled(context.Background(), slog.LevelInfo) {
		t.Fatalf("level not kept: %q", buf.String())
	}
}

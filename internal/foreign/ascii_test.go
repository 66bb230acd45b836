package foreign

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestASCII(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"a pod name is kept", "web-7f9c4d5b8-x2x7q", 253, "web-7f9c4d5b8-x2x7q"},
		{"space kept", "my pod", 253, "my pod"},
		{"terminal escape", "a\x1b]0;x\x07", 253, `a\x1b]0;x\a`},
		{"newline", "a\nb", 253, `a\nb`},
		{"unicode escaped", "grüße", 253, `gr\u00fc\u00dfe`},
		{"invalid UTF-8 byte", "a\xffb", 253, `a\xffb`},
		{"backslash and quote escaped beside an escape", `a\"` + "\n", 253, `a\\\"\n`},
		{"clean but long", strings.Repeat("x", 300), 253, strings.Repeat("x", 229) + "...(+71 bytes)"},
		{"escape not split", strings.Repeat("x", 226) + "ü" + strings.Repeat("y", 30), 253, strings.Repeat("x", 226) + "...(+32 bytes)"},
		{"escape fits", strings.Repeat("x", 223) + "ü" + strings.Repeat("y", 30), 253, strings.Repeat("x", 223) + `\u00fc` + "...(+30 bytes)"},
		{"tiny max, no marker", "üüü", 7, `\u00fc`},
		{"zero max", "abc", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ASCII(tc.in, tc.max)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ASCII (-want +got):\n%s", diff)
			}
			if len(got) > max(tc.max, 0) || !printableASCII(got) {
				t.Errorf("ASCII = %q: %d bytes (max %d), printable ASCII %v", got, len(got), tc.max, printableASCII(got))
			}
		})
	}
}

func FuzzASCII(f *testing.F) {
	for _, s := range []string{"", "pod", "a\x1b]0;x\x07", "grüße", "a\xffb", strings.Repeat("ü", 200), `\\"`} {
		f.Add(s, 253)
		f.Add(s, 30)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = max % 4096
		got := ASCII(s, max)
		if len(got) > max && max >= 0 {
			t.Fatalf("ASCII(%q, %d) = %d bytes", s, max, len(got))
		}
		if !printableASCII(got) {
			t.Fatalf("ASCII(%q, %d) = %q: not printable ASCII", s, max, got)
		}
		if printableASCII(s) && len(s) <= max && got != s {
			t.Fatalf("ASCII(%q, %d) = %q: clean text changed", s, max, got)
		}
	})
}

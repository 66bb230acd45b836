package foreign

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// asciiCutReserve is the room ASCII keeps for its cut marker
// ("...(+N bytes)" with N up to 10 digits).
const asciiCutReserve = 24

// ASCII returns s as printable ASCII (0x20 to 0x7e) of at most max bytes,
// for a foreign value that goes where only printable ASCII is accepted (an
// identity field statsd validates: a pod's name, a label's value). Text
// that is already printable ASCII and short enough is returned as is;
// otherwise every rune outside printable ASCII (and every backslash and
// double quote, so that escapes read unambiguously) is written as Go
// escapes it (\n, \x1b, \u00fc, \xff for a byte that is not UTF-8), and
// when the result would exceed max it is cut before the escape that does
// not fit, followed by "...(+N bytes)", N counting the input left out. A
// max below 24 leaves no room for the marker: the result is then cut to max
// without one.
func ASCII(s string, max int) string {
	if max < 0 {
		max = 0
	}
	if len(s) <= max && printableASCII(s) {
		return s
	}
	esc := escapeASCII(s, len(s))
	if len(esc) <= max {
		return esc
	}
	if max < asciiCutReserve {
		return cutEscaped(s, max)
	}
	head := cutEscaped(s, max-asciiCutReserve)
	return head + "...(+" + strconv.Itoa(len(s)-inputBytes(s, head)) + " bytes)"
}

// printableASCII reports whether every byte of s is 0x20 to 0x7e.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// escapeASCII escapes s (see ASCII) whole.
func escapeASCII(s string, hint int) string {
	var b strings.Builder
	b.Grow(hint)
	for i := 0; i < len(s); {
		n := escapeRune(&b, s[i:])
		i += n
	}
	return b.String()
}

// escapeRune writes the escaped form of the first rune (or invalid byte) of
// s to b and returns how many input bytes it took.
func escapeRune(b *strings.Builder, s string) int {
	r, n := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && n <= 1:
		b.WriteString(`\x`)
		b.WriteString(hex2(s[0]))
		return 1
	case r == '\\' || r == '"':
		b.WriteByte('\\')
		b.WriteRune(r)
	case r >= 0x20 && r <= 0x7e:
		b.WriteRune(r)
	default:
		q := strconv.QuoteRuneToASCII(r) // 'x', '\n', '\u00fc'
		b.WriteString(q[1 : len(q)-1])
	}
	return n
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}

// cutEscaped escapes s rune by rune while the result stays within max
// bytes: an escape is never split.
func cutEscaped(s string, max int) string {
	var b, one strings.Builder
	for i := 0; i < len(s); {
		one.Reset()
		n := escapeRune(&one, s[i:])
		if b.Len()+one.Len() > max {
			break
		}
		b.WriteString(one.String())
		i += n
	}
	return b.String()
}

// inputBytes returns how many bytes of s the escaped prefix head stands for.
func inputBytes(s, head string) int {
	var one strings.Builder
	i, out := 0, 0
	for i < len(s) && out < len(head) {
		one.Reset()
		n := escapeRune(&one, s[i:])
		out += one.Len()
		i += n
	}
	return i
}

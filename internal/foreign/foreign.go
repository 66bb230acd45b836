// Package foreign makes text that statsd did not write safe to carry: a
// guest agent's error message or version, a QMP reply, a hybrid-vsock
// handshake line, a peer's bytes, a name a guest chose. Where such text
// enters, it is cut to a few hundred bytes and freed of control characters
// (an ESC]0;… sequence must never reach a terminal, a log line or a gRPC
// header raw); Quote also quotes it, so that it reads as someone else's
// words. Bound is the backstop for text statsd composed (an error that
// joins many parts), and Handler bounds every string of a log record.
//
// The package depends on the standard library only, so a client (statsctl)
// may use it for what it prints.
package foreign

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxBytes is how much of a foreign string Quote and Text keep: enough to
// read an error message, too little to carry a file or inflate an answer.
const MaxBytes = 256

// Quote returns s cut to MaxBytes (at a rune boundary) and quoted as Go
// quotes strings: every control character, invalid UTF-8 byte and
// non-printable rune (bidi overrides included) is escaped, so the result is
// printable ASCII plus printable Unicode. A cut string is followed by
// "...(+N bytes)". The result is at most about 4*MaxBytes+32 bytes.
func Quote(s string) string {
	head, cut := cutRunes(s, MaxBytes)
	q := strconv.Quote(head)
	if cut > 0 {
		q += "...(+" + strconv.Itoa(cut) + " bytes)"
	}
	return q
}

// QuoteBytes is Quote for a byte slice.
func QuoteBytes(b []byte) string {
	if len(b) > 4*MaxBytes {
		// Do not copy more than is kept.
		head, cut := cutRunes(string(b[:4*MaxBytes]), MaxBytes)
		return strconv.Quote(head) + "...(+" + strconv.Itoa(cut+len(b)-4*MaxBytes) + " bytes)"
	}
	return Quote(string(b))
}

// Text returns s cut to MaxBytes, with every control character, invalid
// UTF-8 byte and non-printable rune replaced by U+FFFD, unquoted: for a
// foreign value carried in a field of its own (an agent version, an
// interface name), which whoever prints it quotes.
func Text(s string) string { return Bound(s, MaxBytes) }

// Bound returns s cut to max bytes (at a rune boundary), with every control
// character, invalid UTF-8 byte and non-printable rune replaced by U+FFFD
// (space is kept; tab and newline are not). A cut string ends with
// "...(+N bytes)". The result is at most max+24 bytes, plus two bytes per
// replaced ASCII control character. Text that is already clean and short is
// returned as is.
func Bound(s string, max int) string {
	if max < 0 {
		max = 0
	}
	head, cut := cutRunes(s, max)
	if clean(head) {
		if cut == 0 {
			return s
		}
		return head + "...(+" + strconv.Itoa(cut) + " bytes)"
	}
	var b strings.Builder
	b.Grow(len(head) + 8)
	for i := 0; i < len(head); {
		r, n := utf8.DecodeRuneInString(head[i:])
		if (r == utf8.RuneError && n <= 1) || !printable(r) {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(head[i : i+n])
		}
		i += n
	}
	if cut > 0 {
		b.WriteString("...(+" + strconv.Itoa(cut) + " bytes)")
	}
	return b.String()
}

// printable is strconv.IsPrint: space is printable; tab, newline, ESC, DEL,
// C1 controls and format characters (bidi overrides) are not.
func printable(r rune) bool { return strconv.IsPrint(r) }

// clean reports whether s is valid UTF-8 of printable runes only.
func clean(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !printable(r) {
			return false
		}
	}
	return true
}

// cutRunes returns the longest prefix of s of at most max bytes that ends at
// a rune boundary, and how many bytes were left out.
func cutRunes(s string, max int) (string, int) {
	if len(s) <= max {
		return s, 0
	}
	end := max
	for end > 0 && end > max-utf8.UTFMax && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end], len(s) - end
}

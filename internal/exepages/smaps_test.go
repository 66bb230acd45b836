package exepages

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

// smaps is a statsd's /proc/self/smaps, shortened to the lines that count:
// its executable (device fe:00, inode 10764881) mapped as text, rodata and
// data, beside a file of the same inode on another device, the heap, libc
// and the vdso.
const smaps = `00400000-009e7000 r-xp 00000000 fe:00 10764881                           /usr/local/bin/statsd
Rss:                5724 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me
009e7000-010f5000 r--p 005e7000 fe:00 10764881                           /usr/local/bin/statsd
Rss:                6584 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd mr mw me
010f5000-01163000 rw-p 00cf5000 fe:00 10764881                           /usr/local/bin/statsd
Anonymous:           108 kB
Swap:                  0 kB
01163000-011b0000 rw-p 00000000 00:00 0 
Anonymous:           108 kB
Swap:                  0 kB
02000000-02100000 r--s 00000000 fe:00 10764881                           /usr/local/bin/statsd
Anonymous:             0 kB
Swap:                  0 kB
03000000-03100000 r--p 00000000 fe:01 10764881                           /other/device/same/inode
Anonymous:             0 kB
Swap:                  0 kB
c000000000-c000400000 rw-p 00000000 00:00 0 
Anonymous:          4116 kB
Swap:                  0 kB
7faeb3950000-7faeb3978000 r--p 00000000 fe:00 1311                       /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
Swap:                  0 kB
7ffd4a1f2000-7ffd4a1f4000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
Swap:                  0 kB
`

// readers are the ways the tests feed parseSmaps: through Release's
// buffer, through a buffer just over the fixtures' longest line (so that
// lines straddle reads), and a byte at a time.
var readers = []struct {
	name string
	buf  int
	wrap func(io.Reader) io.Reader
}{
	{"whole reads", lineBuf, func(r io.Reader) io.Reader { return r }},
	{"short buffer", 128, func(r io.Reader) io.Reader { return r }},
	{"one byte a read", lineBuf, iotest.OneByteReader},
}

// longPath is a path longer than Release's buffer.
var longPath = "/usr/local/bin/" + strings.Repeat("d/", lineBuf/2) + "statsd"

func TestParseSmaps(t *testing.T) {
	exe := file{dev: "fe:00", ino: 10764881}
	tests := []struct {
		name string
		in   string
		exe  file
		want []span
	}{
		{name: "statsd: text and rodata, never data, a shared mapping or another device", in: smaps, exe: exe,
			want: []span{{0x400000, 0x9e7000}, {0x9e7000, 0x10f5000}}},
		{name: "replaced binary (deleted) still matched by inode", exe: exe,
			in:   "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd (deleted)\nAnonymous: 0 kB\nSwap: 0 kB\n",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "PIE: RELRO data relocated (anonymous copies) is kept, the text released", exe: exe,
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\nSwap: 0 kB\n" +
				"009e7000-010f5000 r--p 005e7000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 8 kB\nSwap: 0 kB\n",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "PIE: RELRO copies swapped out (Swap, not Anonymous) are kept", exe: exe,
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\nSwap: 0 kB\n" +
				"009e7000-010f5000 r--p 005e7000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\nSwap: 8 kB\n",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "no Swap line: kept", exe: exe,
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\n"},
		{name: "overlay: another device and inode in smaps, matched by the path", exe: file{dev: "00:2f", ino: 5, path: "/usr/local/bin/statsd"},
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\nSwap: 0 kB\n" +
				"03000000-03100000 r--p 00000000 fe:01 99 /usr/local/bin/other\nAnonymous: 0 kB\nSwap: 0 kB\n",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "no Anonymous line: kept", exe: exe,
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nRss: 4 kB\n"},
		{name: "no newline at the end", exe: exe,
			in:   "00400000-009e7000 r-xp 00000000 fe:00 10764881 /usr/local/bin/statsd\nAnonymous: 0 kB\nSwap: 0 kB",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "a path longer than the buffer: matched by inode", exe: exe,
			in:   "00400000-009e7000 r-xp 00000000 fe:00 10764881 " + longPath + "\nAnonymous: 0 kB\nSwap: 0 kB\n",
			want: []span{{0x400000, 0x9e7000}}},
		{name: "a path longer than the buffer: never matched by its cut path", exe: file{dev: "00:2f", ino: 5, path: longPath[:lineBuf/2]},
			in: "00400000-009e7000 r-xp 00000000 fe:00 10764881 " + longPath + "\nAnonymous: 0 kB\nSwap: 0 kB\n"},
		{name: "another executable", in: smaps, exe: file{dev: "fe:00", ino: 1}},
		{name: "empty", exe: exe},
	}
	for _, tt := range tests {
		for _, rd := range readers {
			if rd.buf < lineBuf && strings.Contains(tt.in, longPath) {
				continue
			}
			t.Run(tt.name+"/"+rd.name, func(t *testing.T) {
				got, err := parseSmaps(rd.wrap(strings.NewReader(tt.in)), tt.exe, make([]byte, rd.buf))
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(span{})); diff != "" {
					t.Errorf("parseSmaps (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestParseSmapsErrors(t *testing.T) {
	exe := file{dev: "fe:00", ino: 7}
	for _, in := range []string{
		"00400000-009e7000 r-xp 00000000 fe:00\n",
		"00400000-009e7000 r-xp 00000000 fe:00 seven /bin/x\n",
		"00400000 r-xp 00000000 fe:00 7 /bin/x\n",
		"0040000g-009e7000 r-xp 00000000 fe:00 7 /bin/x\n",
		"00400000-0040000g r-xp 00000000 fe:00 7 /bin/x\n",
		"00400000-1ffffffffffffffff r-xp 00000000 fe:00 7 /bin/x\n",
		"009e7000-00400000 r-xp 00000000 fe:00 7 /bin/x\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: many kB\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: -1 kB\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: 0\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nSwap: 0 kB kB\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: 0 kB" + strings.Repeat(" ", lineBuf) + "\n",
		"00400000-009e7000 r-xp 00000000 fe:00 " + strings.Repeat("7", lineBuf) + " /bin/x\n",
	} {
		t.Run(fmt.Sprintf("%.60q", in), func(t *testing.T) {
			if _, err := parseSmaps(strings.NewReader(in), exe, make([]byte, lineBuf)); !errors.Is(err, ErrParse) {
				t.Errorf("parseSmaps(%q) = %v, want ErrParse", in, err)
			}
		})
	}
}

func TestParseSmapsBounds(t *testing.T) {
	exe := file{dev: "fe:00", ino: 10764881}
	t.Run("longer than maxSmaps", func(t *testing.T) {
		in := io.MultiReader(strings.NewReader(smaps), strings.NewReader(strings.Repeat("Rss: 0 kB\n", maxSmaps/10)))
		if _, err := parseSmaps(in, exe, make([]byte, lineBuf)); err == nil || !strings.Contains(err.Error(), "longer than") {
			t.Errorf("parseSmaps of more than %d bytes = %v, want refused", maxSmaps, err)
		}
	})
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		in := io.MultiReader(strings.NewReader(smaps), iotest.ErrReader(boom))
		if _, err := parseSmaps(in, exe, make([]byte, lineBuf)); !errors.Is(err, boom) {
			t.Errorf("parseSmaps = %v, want %v", err, boom)
		}
	})
}

// FuzzParseSmaps parses the input through a buffer of size bytes (at least
// 80) and a reader that returns chunk bytes a read: no span is empty; when
// no line is as long as the buffer, what it returns does not depend on
// the buffer or the reads; otherwise it returns no more than with a buffer
// holding the whole input.
func FuzzParseSmaps(f *testing.F) {
	f.Add(smaps, uint16(lineBuf), uint16(0))
	f.Add(smaps, uint16(90), uint16(7))
	f.Add("00400000-009e7000 r-xp 00000000 fe:00 10764881 "+longPath+"\nAnonymous: 0 kB\nSwap: 0 kB\n", uint16(lineBuf), uint16(1))
	f.Fuzz(func(t *testing.T, in string, size, chunk uint16) {
		exe := file{dev: "fe:00", ino: 10764881, path: "/usr/local/bin/statsd"}
		buf := max(int(size)%(2*lineBuf), 80)
		var r io.Reader = strings.NewReader(in)
		if chunk > 0 {
			r = &chunkReader{r, int(chunk)}
		}
		spans, err := parseSmaps(r, exe, make([]byte, buf))
		for _, s := range spans {
			if s.end <= s.start {
				t.Fatalf("empty span %+v from %q", s, in)
			}
		}
		whole, wholeErr := parseSmaps(strings.NewReader(in), exe, make([]byte, len(in)+1))
		if longestLine(in) < buf {
			if (err == nil) != (wholeErr == nil) || !slices.Equal(spans, whole) {
				t.Fatalf("through %d bytes: %+v, %v; whole: %+v, %v", buf, spans, err, whole, wholeErr)
			}
			return
		}
		if err == nil && wholeErr == nil {
			for _, s := range spans {
				if !slices.Contains(whole, s) {
					t.Fatalf("through %d bytes: span %+v, not in %+v", buf, s, whole)
				}
			}
		}
	})
}

// longestLine is the length of the longest line of s, without its newline.
func longestLine(s string) int {
	n := 0
	for len(s) > 0 {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			i = len(s)
		}
		n = max(n, i)
		s = s[min(i+1, len(s)):]
	}
	return n
}

// chunkReader returns at most n bytes a read.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	return c.r.Read(p[:min(len(p), c.n)])
}

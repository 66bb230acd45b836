package exepages

import (
	"errors"
	"strings"
	"testing"

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
		{name: "another executable", in: smaps, exe: file{dev: "fe:00", ino: 1}},
		{name: "empty", exe: exe},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSmaps(strings.NewReader(tt.in), tt.exe)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(span{})); diff != "" {
				t.Errorf("parseSmaps (-want +got):\n%s", diff)
			}
		})
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
		"009e7000-00400000 r-xp 00000000 fe:00 7 /bin/x\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: many kB\n",
		"00400000-009e7000 r-xp 00000000 fe:00 7 /bin/x\nAnonymous: 0\n",
	} {
		t.Run(in, func(t *testing.T) {
			if _, err := parseSmaps(strings.NewReader(in), exe); !errors.Is(err, ErrParse) {
				t.Errorf("parseSmaps(%q) = %v, want ErrParse", in, err)
			}
		})
	}
}

func FuzzParseSmaps(f *testing.F) {
	f.Add(smaps)
	f.Fuzz(func(t *testing.T, in string) {
		spans, err := parseSmaps(strings.NewReader(in), file{dev: "fe:00", ino: 10764881})
		if err != nil {
			return
		}
		for _, s := range spans {
			if s.end <= s.start {
				t.Fatalf("empty span %+v from %q", s, in)
			}
		}
	})
}

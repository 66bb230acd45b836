package exepages

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxSmaps bounds what is read of /proc/self/smaps; a longer file is
// refused (its last mapping's Anonymous line would be cut off).
const maxSmaps = 4 << 20

// lineBuf is the size of the buffer Release reads smaps through. A
// mapping's line is about 75 bytes of fields and then its path (up to
// PATH_MAX, 4096 bytes, a newline in it escaped as \012); a line longer
// than the buffer is parsed from its first lineBuf bytes: such a mapping
// matches the executable by device and inode only, never by its cut path.
const lineBuf = 4096

// parseSmaps returns the mappings of exe in the text of /proc/<pid>/smaps
// read from r that are read-only and private ("r--p", "r-xp") and hold no
// anonymous page, in memory or swapped out. A writable or shared mapping
// is never returned, nor a read-only one with private copies (a PIE's
// RELRO data, relocated by the dynamic loader before it was made
// read-only: dropping them would bring back the file's unrelocated bytes;
// a copy swapped out shows in Swap, not Anonymous), nor one whose
// Anonymous or Swap line is missing.
//
// It reads r through buf a line at a time and parses each line where it
// lies in buf: it allocates only the spans it returns. A line longer than
// buf is parsed from its start (see lineBuf); more than maxSmaps bytes are
// refused.
func parseSmaps(r io.Reader, exe file, buf []byte) ([]span, error) {
	p := smapsParser{exe: exe}
	n, total := 0, 0 // buf[:n] holds the start of a line; total bytes read
	skip := false    // buf holds the rest of a line already parsed from its start
	for {
		m, err := r.Read(buf[n:])
		if total += m; total > maxSmaps {
			return nil, fmt.Errorf("exepages: longer than %d bytes", maxSmaps)
		}
		rest := buf[:n+m]
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				break
			}
			if !skip {
				if err := p.line(rest[:i], false); err != nil {
					return nil, err
				}
			}
			skip, rest = false, rest[i+1:]
		}
		n = copy(buf, rest)
		if n == len(buf) { // a line longer than buf
			if !skip {
				if err := p.line(buf, true); err != nil {
					return nil, err
				}
			}
			skip, n = true, 0
		}
		if errors.Is(err, io.EOF) {
			if !skip {
				if err := p.line(buf[:n], false); err != nil {
					return nil, err
				}
			}
			p.flush()
			return p.spans, nil
		}
		if err != nil {
			return nil, fmt.Errorf("exepages: %w", err)
		}
	}
}

// smapsParser holds what parseSmaps has read so far.
type smapsParser struct {
	exe   file
	spans []span
	cur   span // the exe's read-only private mapping being read, if in
	in    bool
	// Whether cur's last Anonymous and Swap lines said 0 kB.
	anonZero, swapZero bool
}

// flush ends the mapping being read.
func (p *smapsParser) flush() {
	if p.in && p.anonZero && p.swapZero {
		p.spans = append(p.spans, p.cur)
	}
	p.in, p.anonZero, p.swapZero = false, false, false
}

// line parses one line of smaps (without its newline); cut says it is the
// start of a longer line.
func (p *smapsParser) line(b []byte, cut bool) error {
	key, rest := field(b)
	if len(key) == 0 {
		return nil
	}
	if key[len(key)-1] != ':' { // a mapping: address perms offset dev inode [path]
		p.flush()
		s, ok, err := parseMapping(key, rest, p.exe, cut)
		if err != nil {
			return fmt.Errorf("%w: line %q: %w", ErrParse, b, err)
		}
		p.cur, p.in = s, ok
		return nil
	}
	anon := string(key) == "Anonymous:"
	if !p.in || !anon && string(key) != "Swap:" {
		return nil
	}
	num, rest := field(rest)
	unit, rest := field(rest)
	if extra, _ := field(rest); cut || len(unit) == 0 || len(extra) != 0 {
		return fmt.Errorf("%w: line %q", ErrParse, b)
	}
	kb, ok := parseUint(num, 10)
	if !ok {
		return fmt.Errorf("%w: line %q: bad number %q", ErrParse, b, num)
	}
	if anon {
		p.anonZero = kb == 0
	} else {
		p.swapZero = kb == 0
	}
	return nil
}

// parseMapping reads a mapping's line, its address range addr and the
// fields after it in rest, and says whether it is a read-only private
// mapping of exe. cut says the line goes on past rest: its path is not
// compared.
func parseMapping(addr, rest []byte, exe file, cut bool) (span, bool, error) {
	perms, rest := field(rest)
	_, rest = field(rest) // offset
	dev, rest := field(rest)
	inode, rest := field(rest)
	if len(inode) == 0 || cut && len(rest) == 0 { // a cut line holds its fields whole
		return span{}, false, errors.New("too few fields")
	}
	ino, ok := parseUint(inode, 10)
	if !ok {
		return span{}, false, fmt.Errorf("bad inode %q", inode)
	}
	lo, hi, ok := bytes.Cut(addr, []byte{'-'})
	if !ok {
		return span{}, false, errors.New("no range")
	}
	start, ok1 := parseUint(lo, 16)
	end, ok2 := parseUint(hi, 16)
	if !ok1 || !ok2 {
		return span{}, false, fmt.Errorf("bad range %q", addr)
	}
	if end <= start {
		return span{}, false, errors.New("empty range")
	}
	sameFile := ino == exe.ino && string(dev) == exe.dev
	if !sameFile && (cut || exe.path == "" || string(bytes.Trim(rest, " \t")) != exe.path) {
		return span{}, false, nil
	}
	if len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
		return span{}, false, nil
	}
	return span{uintptr(start), uintptr(end)}, true, nil
}

// field returns the first field of b (split at spaces and tabs) and what
// follows it.
func field(b []byte) (f, rest []byte) {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	j := i
	for j < len(b) && b[j] != ' ' && b[j] != '\t' {
		j++
	}
	return b[i:j], b[j:]
}

// parseUint parses b, digits of base 10 or 16 and nothing else, as a
// uintptr-sized number; false if it is empty, holds another byte or
// overflows.
func parseUint(b []byte, base uint64) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	const maxVal = uint64(^uintptr(0))
	var n uint64
	for _, c := range b {
		var d uint64
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case base == 16 && 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		case base == 16 && 'A' <= c && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if n > (maxVal-d)/base {
			return 0, false
		}
		n = n*base + d
	}
	return n, true
}

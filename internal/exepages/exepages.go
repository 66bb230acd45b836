package exepages

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultProcRoot is where procfs is mounted.
const DefaultProcRoot = "/proc"

// ErrParse reports a line of /proc/<pid>/smaps that does not parse.
var ErrParse = errors.New("exepages: parse error")

// maxSmaps bounds what is read of /proc/self/smaps; a longer file is
// refused (its last mapping's Anonymous line would be cut off).
const maxSmaps = 4 << 20

// span is one mapping: [start, end) in the process's address space.
type span struct{ start, end uintptr }

// file names a file by its device (major:minor, as smaps prints it, in hex)
// and inode, and by the path /proc/self/exe reads as (what smaps prints
// where the device differs: an overlay file system may show the layer's
// device and inode in smaps but its own to stat).
type file struct {
	dev  string
	ino  uint64
	path string
}

// Release drops the page-table entries of every read-only, private mapping
// of the running executable (procRoot/self/exe, matched by device and inode
// in procRoot/self/smaps) that holds only file pages, and returns how many
// bytes of address space it advised (mapped or not). procRoot is
// DefaultProcRoot outside tests.
func Release(procRoot string) (uint64, error) {
	exe, err := exeFile(filepath.Join(procRoot, "self", "exe"))
	if err != nil {
		return 0, err
	}
	path := filepath.Join(procRoot, "self", "smaps")
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("exepages: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSmaps+1))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("exepages: %s: %w", path, err)
	}
	if len(data) > maxSmaps {
		return 0, fmt.Errorf("exepages: %s: longer than %d bytes", path, maxSmaps)
	}
	spans, err := parseSmaps(bytes.NewReader(data), exe)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	var n uint64
	for _, s := range spans {
		if err := dontNeed(s); err != nil {
			return n, fmt.Errorf("exepages: madvise %#x-%#x: %w", s.start, s.end, err)
		}
		n += uint64(s.end - s.start)
	}
	return n, nil
}

// parseSmaps returns the mappings of exe in the text of /proc/<pid>/smaps
// that are read-only and private ("r--p", "r-xp") and hold no anonymous
// page, in memory or swapped out. A writable or shared mapping is never
// returned, nor a read-only one with private copies (a PIE's RELRO data,
// relocated by the dynamic loader before it was made read-only: dropping
// them would bring back the file's unrelocated bytes; a copy swapped out
// shows in Swap, not Anonymous), nor one whose Anonymous or Swap line is
// missing.
func parseSmaps(r io.Reader, exe file) ([]span, error) {
	var spans []span
	var cur *span        // the exe's read-only private mapping being read
	anon, swap := -1, -1 // its Anonymous and Swap kB; -1 before the line
	flush := func() {
		if cur != nil && anon == 0 && swap == 0 {
			spans = append(spans, *cur)
		}
		cur, anon, swap = nil, -1, -1
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping: address perms offset dev inode [path]
			flush()
			s, ok, err := parseMapping(f, exe)
			if err != nil {
				return nil, fmt.Errorf("%w: line %q: %w", ErrParse, line, err)
			}
			if ok {
				cur = &s
			}
			continue
		}
		if cur != nil && (f[0] == "Anonymous:" || f[0] == "Swap:") {
			if len(f) != 3 {
				return nil, fmt.Errorf("%w: line %q", ErrParse, line)
			}
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				return nil, fmt.Errorf("%w: line %q: %w", ErrParse, line, err)
			}
			if f[0] == "Swap:" {
				swap = kb
			} else {
				anon = kb
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParse, err)
	}
	flush()
	return spans, nil
}

// parseMapping reads the fields of a mapping's line and says whether it is
// a read-only private mapping of exe.
func parseMapping(f []string, exe file) (span, bool, error) {
	if len(f) < 5 {
		return span{}, false, errors.New("too few fields")
	}
	ino, err := strconv.ParseUint(f[4], 10, 64)
	if err != nil {
		return span{}, false, err
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return span{}, false, errors.New("no range")
	}
	start, err := strconv.ParseUint(lo, 16, 64)
	if err != nil {
		return span{}, false, err
	}
	end, err := strconv.ParseUint(hi, 16, 64)
	if err != nil {
		return span{}, false, err
	}
	if end <= start {
		return span{}, false, errors.New("empty range")
	}
	sameFile := ino == exe.ino && f[3] == exe.dev
	if !sameFile && (exe.path == "" || len(f) < 6 || strings.Join(f[5:], " ") != exe.path) {
		return span{}, false, nil
	}
	if perms := f[1]; len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
		return span{}, false, nil
	}
	return span{uintptr(start), uintptr(end)}, true, nil
}

// DefaultDelay is how long after start-up a daemon releases its binary's
// read-only pages: past its start (init, flag parsing, its listeners and
// first connections), which touches code and data it will not touch
// again. It is short so that the one timer has fired before anything
// watches an idle daemon (e2e TestIntegrationSeveralWorkloadsMemory
// counts an idle statsd's context switches from about 10 s after its
// start): what the first requests touch after it and never again stays
// mapped.
const DefaultDelay = 5 * time.Second

// ReleaseAfter calls Release(procRoot) once, delay from now, unless ctx
// ends first, and logs what it advised at Debug (a failure at Warn: the
// daemon runs on either way). It blocks: run it on its own goroutine.
func ReleaseAfter(ctx context.Context, procRoot string, delay time.Duration, logger *slog.Logger) {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	n, err := Release(procRoot)
	if err != nil {
		logger.Warn("releasing the binary's read-only pages", "err", err)
		return
	}
	if n == 0 {
		// Nothing matched the binary (a file system whose smaps names
		// neither its device and inode nor its path): the daemon keeps
		// its start-up pages, which an operator should be able to see.
		logger.Info("released none of the binary's read-only pages: no mapping of it found")
		return
	}
	logger.Debug("released the binary's read-only pages", "bytes", n)
}

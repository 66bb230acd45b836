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

// ErrParse reports a line of /proc/<pid>/maps that does not parse.
var ErrParse = errors.New("exepages: parse error")

// maxMaps bounds what is read of /proc/self/maps.
const maxMaps = 1 << 20

// span is one mapping: [start, end) in the process's address space.
type span struct{ start, end uintptr }

// file names a file by its device (major:minor, as maps prints it, in hex)
// and inode.
type file struct {
	dev string
	ino uint64
}

// Release drops the page-table entries of every read-only, private mapping
// of the running executable (procRoot/self/exe, matched by device and inode
// in procRoot/self/maps) and returns how many bytes of address space it
// advised (mapped or not). procRoot is DefaultProcRoot outside tests.
func Release(procRoot string) (uint64, error) {
	exe, err := exeFile(filepath.Join(procRoot, "self", "exe"))
	if err != nil {
		return 0, err
	}
	path := filepath.Join(procRoot, "self", "maps")
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("exepages: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxMaps))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("exepages: %s: %w", path, err)
	}
	spans, err := parseMaps(bytes.NewReader(data), exe)
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

// parseMaps returns the mappings of exe in the text of /proc/<pid>/maps
// that are read-only and private ("r--p", "r-xp"); a writable or shared one
// is never returned.
func parseMaps(r io.Reader, exe file) ([]span, error) {
	var spans []span
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		// address perms offset dev inode [path]
		f := strings.Fields(line)
		if len(f) < 5 {
			return nil, fmt.Errorf("%w: line %q", ErrParse, line)
		}
		ino, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: line %q: %w", ErrParse, line, err)
		}
		if ino != exe.ino || f[3] != exe.dev {
			continue
		}
		if perms := f[1]; len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("%w: line %q: no range", ErrParse, line)
		}
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: line %q: %w", ErrParse, line, err)
		}
		end, err := strconv.ParseUint(hi, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: line %q: %w", ErrParse, line, err)
		}
		if end <= start {
			return nil, fmt.Errorf("%w: line %q: empty range", ErrParse, line)
		}
		spans = append(spans, span{uintptr(start), uintptr(end)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParse, err)
	}
	return spans, nil
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
	logger.Debug("released the binary's read-only pages", "bytes", n)
}

package exepages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// DefaultProcRoot is where procfs is mounted.
const DefaultProcRoot = "/proc"

// ErrParse reports a line of /proc/<pid>/smaps that does not parse.
var ErrParse = errors.New("exepages: parse error")

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
//
// It reads smaps a line at a time through one lineBuf-byte buffer and
// parses each line in place: an idle daemon that has never collected keeps
// every byte it allocated, so the release allocates next to nothing
// (TestReleaseAllocations).
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
	spans, err := parseSmaps(f, exe, make([]byte, lineBuf))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err) // err names the package
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

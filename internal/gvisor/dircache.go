// This file is the cache of open cgroup directory handles: acquiring,
// releasing and dropping them, and checking a held one is still the cgroup.

package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// dirID names dir of root in the cache (a comparable key that costs no
// allocation to make).
type dirID struct {
	root *os.Root
	dir  string
}

// dirHandle is an open cgroup directory and the number of reads using it
// (guarded by cgroupSource.mu). A handle dropped from the cache (its
// directory was removed, or the source closed) is closed by the last read
// that uses it, so no handle (and no dying memcg) is pinned until Close.
type dirHandle struct {
	f       *os.File // the directory, opened inside its root
	users   int
	dropped bool
	// kept are the files of the directory held open between samples and
	// read with pread at offset 0 (keptfiles.go); nil when the directory is
	// not on a cgroup file system.
	kept *keptFiles
}

// errClosed: the source was closed.
var errClosed = fmt.Errorf("gvisor: %w: source closed", source.ErrNotMeasurable)

// acquireDir returns the cgroup directory dir of root, opened once (inside
// root, so it cannot escape) and cached, so that each file read is a single
// openat relative to it. It blocks (the open is a file system call): it runs
// inside a sample's bounded read. The caller uses it until releaseDir.
func (s *cgroupSource) acquireDir(root *os.Root, dir string) (*dirHandle, error) {
	id := dirID{root, dir}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	if h := s.dirs[id]; h != nil {
		h.users++
		s.mu.Unlock()
		return h, nil
	}
	s.mu.Unlock()
	f, err := root.OpenFile(rel(dir), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if testHook != nil {
		testHook("open")
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			s.mu.Lock()
			if s.missing == nil {
				s.missing = map[dirID]time.Time{}
			}
			s.missing[id] = time.Now()
			s.mu.Unlock()
		}
		return nil, err
	}
	kept := newKeptFiles(f)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close ran while the directory was being opened
		f.Close()
		return nil, errClosed
	}
	delete(s.missing, id)
	h := s.dirs[id]
	if h != nil { // another read opened it meanwhile
		f.Close()
	} else {
		h = &dirHandle{f: f, kept: kept}
		s.dirs[id] = h
	}
	h.users++
	return h, nil
}

// missingRecheck is how long a cgroup directory found missing is taken as
// missing by the optional (signal) reads before they open it again: a
// sandbox in no cgroup of a hierarchy (the unified one of a pod on a hybrid
// host, whose v1 cgroups the launcher made alone) is not opened, and its
// absence built, at every sample. A directory made meanwhile is read from
// the first sample after the interval; a required file's read always
// opens.
const missingRecheck = 10 * time.Second

// errMissingCached is a directory's open error while it is known missing.
var errMissingCached = fmt.Errorf("cgroup directory missing (looked up again every %v): %w", missingRecheck, fs.ErrNotExist)

// knownMissing says whether dir of root was found missing less than
// missingRecheck ago.
func (s *cgroupSource) knownMissing(root *os.Root, dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.missing[dirID{root, dir}]
	return ok && time.Since(at) < missingRecheck
}

// releaseDir ends one use of h; a dropped handle is closed by its last user.
func (s *cgroupSource) releaseDir(h *dirHandle) {
	if h == nil {
		return
	}
	s.mu.Lock()
	h.users--
	if h.dropped && h.users == 0 {
		h.closeLocked()
	}
	s.mu.Unlock()
}

// dropLocked marks h no longer cached and closes it if no read uses it.
func (s *cgroupSource) dropLocked(h *dirHandle) {
	if h.dropped {
		return
	}
	h.dropped = true
	if h.users == 0 {
		h.closeLocked()
	}
}

// closeLocked closes the directory and the files kept open in it.
func (h *dirHandle) closeLocked() {
	h.kept.closeAll()
	h.f.Close()
}

// forgetDir drops a cached directory that was removed (or removed and made
// again). Concurrent reads may still use it: the last of them closes it.
func (s *cgroupSource) forgetDir(root *os.Root, dir string, h *dirHandle) {
	id := dirID{root, dir}
	s.mu.Lock()
	if s.dirs[id] == h {
		delete(s.dirs, id)
		s.dropLocked(h)
	}
	s.mu.Unlock()
}

// dropDirsOutsideLocked drops the cached directories (and their kept files)
// that loc, a relocated sentry's new location, does not read: those of its
// old cgroups. A directory is kept by its path alone (any hierarchy), and
// every hierarchy's root ("/", blkio's device list) is kept.
func (s *cgroupSource) dropDirsOutsideLocked(loc *location) {
	a := loc.aux
	keep := []string{"/", loc.mem, loc.cpu, a.CFS.Path, a.Pids.Path, a.Blkio.Path, a.Unified.Path}
	for id, h := range s.dirs {
		if !slices.Contains(keep, id.dir) {
			delete(s.dirs, id)
			s.dropLocked(h)
		}
	}
	for id := range s.missing {
		if !slices.Contains(keep, id.dir) {
			delete(s.missing, id)
		}
	}
}

// testHook, when a test sets it, runs inside the open ("open", after it) of
// a cgroup directory, to hold that call.
var testHook func(op string)

// dirState says whether dir exists in root and, when h is not nil, whether
// it is still the directory h holds open. It blocks (two stats): it runs
// inside a sample's bounded read.
func dirState(root *os.Root, dir string, h *dirHandle) (exists, same bool, err error) {
	cur, err := root.Stat(rel(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil || h == nil {
		return err == nil, false, err
	}
	held, err := h.f.Stat()
	if err != nil {
		return true, false, nil
	}
	return true, os.SameFile(cur, held), nil
}

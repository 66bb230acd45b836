// This file is the cache of open cgroup directory handles: acquiring,
// releasing and dropping them, and checking a held one is still the cgroup.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// dirKey names dir of root in the cache and in shared reads: a plain
// concatenation, cheaper per file than display's filepath.Join.
func dirKey(root *os.Root, dir string) string { return root.Name() + "\x00" + dir }

// dirHandle is an open cgroup directory and the number of reads using it
// (guarded by cgroupSource.mu). A handle dropped from the cache (its
// directory was removed, or the source closed) is closed by the last read
// that uses it, so no handle (and no dying memcg) is pinned until Close.
type dirHandle struct {
	r       *os.Root
	users   int
	dropped bool
}

// errClosed: the source was closed.
var errClosed = fmt.Errorf("gvisor: %w: source closed", source.ErrNotMeasurable)

// acquireDir returns the cgroup directory dir of root, opened once (inside
// root, so it cannot escape) and cached, so that each file read is a single
// openat. The caller uses it until releaseDir.
func (s *cgroupSource) acquireDir(ctx context.Context, root *os.Root, dir string) (*dirHandle, error) {
	key := dirKey(root, dir)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	if h := s.dirs[key]; h != nil {
		h.users++
		s.mu.Unlock()
		return h, nil
	}
	s.mu.Unlock()
	d, err := bounded.Do(ctx, s.g, "dir\x00"+key, func() (*os.Root, error) {
		d, err := root.OpenRoot(rel(dir))
		if testHook != nil {
			testHook("open")
		}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close ran while the directory was being opened
		d.Close()
		return nil, errClosed
	}
	h := s.dirs[key]
	switch {
	case h != nil && h.r != d: // another caller won
		d.Close()
	case h == nil:
		h = &dirHandle{r: d}
		s.dirs[key] = h
	}
	h.users++
	return h, nil
}

// releaseDir ends one use of h; a dropped handle is closed by its last user.
func (s *cgroupSource) releaseDir(h *dirHandle) {
	if h == nil {
		return
	}
	s.mu.Lock()
	h.users--
	if h.dropped && h.users == 0 {
		h.r.Close()
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
		h.r.Close()
	}
}

// forgetDir drops a cached directory that was removed (or removed and made
// again). Concurrent reads may still use it: the last of them closes it.
func (s *cgroupSource) forgetDir(root *os.Root, dir string, h *dirHandle) {
	key := dirKey(root, dir)
	s.mu.Lock()
	if s.dirs[key] == h {
		delete(s.dirs, key)
		s.dropLocked(h)
	}
	s.mu.Unlock()
}

// testHook, when a test sets it, runs inside the shared stat ("stat") and
// the open ("open", after it) of a cgroup directory, to hold that call.
var testHook func(op string)

// dirState says whether dir exists in root and, when d is not nil, whether it
// is still the directory d holds open. The stat of dir is one bounded call
// shared by concurrent callers, which may hold different handles: it returns
// only what it found, and each caller compares that with its own handle.
func (s *cgroupSource) dirState(ctx context.Context, root *os.Root, dir string, d *os.Root) (exists, same bool, err error) {
	type found struct{ fi fs.FileInfo } // nil fi: no such directory
	cur, err := bounded.Do(ctx, s.g, "stat\x00"+dirKey(root, dir), func() (found, error) {
		if testHook != nil {
			testHook("stat")
		}
		fi, err := root.Stat(rel(dir))
		if errors.Is(err, fs.ErrNotExist) {
			return found{}, nil
		}
		return found{fi}, err
	})
	if err != nil || cur.fi == nil {
		return false, false, err
	}
	if d == nil {
		return true, false, nil
	}
	// This handle's own stat, shared only with callers holding the same one.
	held, err := bounded.Do(ctx, s.g, fmt.Sprintf("held\x00%p", d), func() (found, error) {
		fi, err := d.Stat(".")
		return found{fi}, err
	})
	if errors.Is(err, source.ErrTimeout) {
		return false, false, err
	}
	return true, err == nil && os.SameFile(cur.fi, held.fi), nil
}

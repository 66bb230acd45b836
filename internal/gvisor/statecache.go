// This file caches runsc roots' listings and parsed state files, so that a
// sample re-reads a state file (a whole OCI spec, about 2 KiB of JSON) only
// when it changed: one stat of the root and one of each of the sandbox's
// files per sample instead of a listing and a read and parse of each.

package gvisor

import (
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// racyWindow: a listing or file whose mtime was this recent when it was read
// is read again next time, since a change made within the same coarse
// timestamp tick would leave its mtime (and maybe its size) unchanged.
const racyWindow = time.Second

// stateCache remembers, per runsc root, the state files listed and, per
// file, what it parsed to, keyed by (size, mtime). Safe for concurrent use.
type stateCache struct {
	mu    sync.Mutex
	dirs  map[string]cachedListing // by root
	files map[string]cachedState   // by path
}

type cachedListing struct {
	size  int64
	mtime time.Time
	names []string
}

type cachedState struct {
	size  int64
	mtime time.Time
	st    runscState
}

func newStateCache() *stateCache {
	return &stateCache{dirs: map[string]cachedListing{}, files: map[string]cachedState{}}
}

// stable reports whether a file with this mtime, statted at now, can be
// trusted to show any later change in its mtime.
func stable(mtime, now time.Time) bool { return now.Sub(mtime) > racyWindow }

// list returns root's state file names: the cached ones while the root's
// (size, mtime) is unchanged, else a new listing (the files cached for
// names no longer listed are forgotten).
func (c *stateCache) list(root string) ([]string, error) {
	fi, err := statOf(root)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	d, ok := c.dirs[root]
	c.mu.Unlock()
	if ok && d.size == fi.size && d.mtime.Equal(fi.mtime) {
		return d.names, nil
	}
	names, err := listStates(root)
	if err != nil {
		return nil, err
	}
	names = append([]string(nil), names...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if stable(fi.mtime, time.Now()) {
		c.dirs[root] = cachedListing{size: fi.size, mtime: fi.mtime, names: names}
	} else {
		delete(c.dirs, root)
	}
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		listed[filepath.Join(root, n)] = true
	}
	for p := range c.files {
		if filepath.Dir(p) == filepath.Clean(root) && !listed[p] {
			delete(c.files, p)
		}
	}
	return names, nil
}

// read returns root/name parsed (readState), from the cache while the
// file's (size, mtime) is unchanged.
func (c *stateCache) read(root, name string) (runscState, error) {
	p := filepath.Join(root, name)
	fi, err := statOf(p)
	if err != nil {
		return runscState{}, err
	}
	c.mu.Lock()
	f, ok := c.files[p]
	c.mu.Unlock()
	if ok && f.size == fi.size && f.mtime.Equal(fi.mtime) {
		return f.st, nil
	}
	st, err := readState(root, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && stable(fi.mtime, time.Now()) {
		c.files[p] = cachedState{size: fi.size, mtime: fi.mtime, st: st}
	} else {
		delete(c.files, p)
	}
	return st, err
}

// sizeTime is what the cache compares of a file: its size and mtime.
type sizeTime struct {
	size  int64
	mtime time.Time
}

// statOf is os.Stat's size and mtime, without the FileInfo it allocates
// (the cache stats the root and each of the sandbox's files every sample).
// Its error is an *fs.PathError, as os.Stat's.
func statOf(path string) (sizeTime, error) {
	var st unix.Stat_t
	for {
		err := unix.Stat(path, &st)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			return sizeTime{}, &fs.PathError{Op: "stat", Path: path, Err: err}
		}
	}
	return sizeTime{size: st.Size, mtime: time.Unix(st.Mtim.Unix())}, nil
}

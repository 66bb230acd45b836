// This file caches runsc roots' listings and parsed state files, so that a
// sample re-reads a state file (a whole OCI spec, about 2 KiB of JSON) only
// when it changed: one stat of the root per sample, and one of each of the
// sandbox's files at most every stateTrustFor (see stateCache.read),
// instead of a listing and a read and parse of each.

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

// stateTrustFor is how long a parsed state file is used without a stat of
// its own while its root is unchanged (stateCache.read).
const stateTrustFor = 5 * time.Second

// stateCache remembers, per runsc root, the state files listed and, per
// file, what it parsed to, keyed by (size, mtime). Safe for concurrent use.
type stateCache struct {
	mu    sync.Mutex
	dirs  map[string]cachedListing // by root
	files map[string]cachedState   // by path
	// trustFor is stateTrustFor (0 in a test: every file statted).
	trustFor time.Duration
}

type cachedListing struct {
	sizeTime
	names []string
}

type cachedState struct {
	sizeTime
	checked time.Time // when it was last statted
	st      runscState
}

func newStateCache() *stateCache {
	return &stateCache{dirs: map[string]cachedListing{}, files: map[string]cachedState{}, trustFor: stateTrustFor}
}

// stable reports whether a file with this mtime, statted at now, can be
// trusted to show any later change in its mtime.
func stable(mtime, now time.Time) bool { return now.Sub(mtime) > racyWindow }

// list returns root's state file names: the cached ones while the root's
// (size, mtime, ctime) is unchanged (unchanged true), else a new listing
// (the files cached for names no longer listed are forgotten).
func (c *stateCache) list(root string) (names []string, unchanged bool, err error) {
	fi, err := statOf(root)
	if err != nil {
		return nil, false, err
	}
	c.mu.Lock()
	d, ok := c.dirs[root]
	c.mu.Unlock()
	if ok && d.same(fi) {
		return d.names, true, nil
	}
	names, err = listStates(root)
	if err != nil {
		return nil, false, err
	}
	names = append([]string(nil), names...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if stable(fi.mtime, time.Now()) {
		c.dirs[root] = cachedListing{sizeTime: fi, names: names}
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
	return names, false, nil
}

// read returns root/name parsed (readState), from the cache while the
// file's (size, mtime, ctime) is unchanged.
//
// rootUnchanged says the root's own (size, mtime, ctime) are those of the
// cached listing: no file was created, removed or renamed in it since. The
// file is then not even statted while its cached parse is younger than
// trustFor and has a gofer pid. What statsd keeps of a state file (ids,
// the sandbox's pid and cgroup, the CRI annotations, createdAt: see
// runscState) is written when runsc creates the file and never changes in
// place after, but for goferPid: runsc starts a subcontainer's gofer at
// `runsc start` and rewrites the file in place (no change to the root)
// with its pid. A parse without one is statted every time; the status runsc
// also rewrites in place is not read.
func (c *stateCache) read(root, name string, rootUnchanged bool) (runscState, error) {
	p := filepath.Join(root, name)
	now := time.Now()
	c.mu.Lock()
	f, ok := c.files[p]
	c.mu.Unlock()
	if ok && rootUnchanged && f.st.GoferPID != 0 && now.Sub(f.checked) < c.trustFor {
		return f.st, nil
	}
	fi, err := statOf(p)
	if err != nil {
		return runscState{}, err
	}
	if ok && f.same(fi) {
		c.mu.Lock()
		if g, ok := c.files[p]; ok && g.same(fi) {
			g.checked = now
			c.files[p] = g
		}
		c.mu.Unlock()
		return f.st, nil
	}
	st, err := readState(root, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && stable(fi.mtime, time.Now()) {
		c.files[p] = cachedState{sizeTime: fi, checked: now, st: st}
	} else {
		delete(c.files, p)
	}
	return st, err
}

// sizeTime is what the cache compares of a file: its size, mtime and
// ctime.
type sizeTime struct {
	size         int64
	mtime, ctime time.Time
}

// same reports whether a and b are the same (size, mtime, ctime).
func (a sizeTime) same(b sizeTime) bool {
	return a.size == b.size && a.mtime.Equal(b.mtime) && a.ctime.Equal(b.ctime)
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
	return sizeTime{size: st.Size, mtime: time.Unix(st.Mtim.Unix()), ctime: time.Unix(st.Ctim.Unix())}, nil
}

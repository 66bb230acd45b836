package sweep

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// ErrDiscover is a directory of the socket glob that could not be read.
var ErrDiscover = errors.New("sweep: cannot read a directory of the socket glob")

// DefaultAllowedUIDs returns the socket owners, and server uids, a poller
// allows when given none: root and the poller's own uid.
func DefaultAllowedUIDs() []uint32 {
	if uid := uint32(os.Getuid()); uid != 0 {
		return []uint32{0, uid}
	}
	return []uint32{0}
}

// Refusal is a path the glob matched that is not polled, and why: symlink
// (never followed: it could point anywhere, such as another user's
// daemon), owner (the socket's owner is not an allowed uid), duplicate (a
// hard link to a socket already found: the same daemon).
type Refusal struct {
	Path, Reason string
}

// Discovery is what a glob found: the sockets to poll, sorted, and the
// paths refused.
type Discovery struct {
	Sockets []string
	Refused []Refusal
}

// Discover returns the sockets matching glob, sorted, as DiscoverAllowed
// with the default allowed uids. A glob that matches nothing is not an
// error.
func Discover(glob string) ([]string, error) {
	d, err := DiscoverAllowed(glob, nil)
	return d.Sockets, err
}

// DiscoverAllowed returns the Unix sockets matching glob that are sockets
// themselves (Lstat: a symlink is refused, not followed), owned by a uid in
// allow (nil: DefaultAllowedUIDs) and not the same socket (device and
// inode) as one found before in sorted order. Paths that are not sockets
// are skipped silently, as paths that vanished since the glob. A directory
// of the glob that cannot be read (EMFILE at the descriptor limit, EACCES)
// is an error wrapping ErrDiscover and the directory's error: not a glob
// that matched nothing.
func DiscoverAllowed(pattern string, allow []uint32) (Discovery, error) {
	paths, err := glob(pattern)
	if err != nil {
		return Discovery{}, fmt.Errorf("sweep: socket glob %q: %w", pattern, err)
	}
	slices.Sort(paths)
	allowed := uidSet(allow)
	var d Discovery
	seen := map[fileID]bool{}
	for _, p := range paths {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
			continue // vanished since the glob
		case fi.Mode()&fs.ModeSymlink != 0:
			d.Refused = append(d.Refused, Refusal{p, "symlink"})
			continue
		case fi.Mode().Type() != fs.ModeSocket:
			continue
		}
		id, uid, ok := fileOwner(fi)
		switch {
		case !ok || !allowed[uid]:
			d.Refused = append(d.Refused, Refusal{p, "owner"})
		case seen[id]:
			d.Refused = append(d.Refused, Refusal{p, "duplicate"})
		default:
			seen[id] = true
			d.Sockets = append(d.Sockets, p)
		}
	}
	return d, nil
}

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

func uidSet(allow []uint32) map[uint32]bool {
	if allow == nil {
		allow = DefaultAllowedUIDs()
	}
	set := make(map[uint32]bool, len(allow))
	for _, u := range allow {
		set[u] = true
	}
	return set
}

// glob is filepath.Glob that does not drop the errors of reading a
// directory: at the descriptor limit (EMFILE) or without the permission to
// read it, filepath.Glob matches nothing and says nothing, and a sweep
// would see no daemon. A directory that does not exist, or is not one,
// still matches nothing.
func glob(pattern string) ([]string, error) {
	if _, err := filepath.Match(pattern, ""); err != nil {
		return nil, err
	}
	if !hasMeta(pattern) {
		if _, err := os.Lstat(pattern); err != nil {
			return nil, nil
		}
		return []string{pattern}, nil
	}
	dir, file := filepath.Split(pattern)
	switch dir {
	case "":
		dir = "."
	case string(filepath.Separator):
	default:
		dir = dir[:len(dir)-1] // the trailing separator
	}
	if !hasMeta(dir) {
		return globDir(dir, file, nil)
	}
	if dir == pattern { // filepath.Glob's guard against endless recursion
		return nil, filepath.ErrBadPattern
	}
	dirs, err := glob(dir)
	if err != nil {
		return nil, err
	}
	var matches []string
	for _, d := range dirs {
		if matches, err = globDir(d, file, matches); err != nil {
			return nil, err
		}
	}
	return matches, nil
}

// globDir appends the names in dir matching pattern to matches, sorted.
func globDir(dir, pattern string, matches []string) ([]string, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return matches, nil
	case err != nil:
		return matches, fmt.Errorf("%w: %s: %w", ErrDiscover, dir, err)
	case !fi.IsDir():
		return matches, nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return matches, fmt.Errorf("%w: %s: %w", ErrDiscover, dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return matches, fmt.Errorf("%w: %s: %w", ErrDiscover, dir, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if ok, _ := filepath.Match(pattern, n); ok {
			matches = append(matches, filepath.Join(dir, n))
		}
	}
	return matches, nil
}

// hasMeta reports whether path holds any of filepath.Match's special
// characters (a backslash escapes one, but on Windows, where it is the
// separator).
func hasMeta(path string) bool {
	magic := `*?[\`
	if runtime.GOOS == "windows" {
		magic = `*?[`
	}
	return strings.ContainsAny(path, magic)
}

package sweep

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

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
// are skipped silently, as paths that vanished since the glob.
func DiscoverAllowed(glob string, allow []uint32) (Discovery, error) {
	paths, err := filepath.Glob(glob)
	if err != nil {
		return Discovery{}, fmt.Errorf("sweep: socket glob %q: %w", glob, err)
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

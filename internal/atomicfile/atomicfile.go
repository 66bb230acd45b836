// Package atomicfile writes small state files crash-safely: a reader (or a
// daemon restarting after a crash or power loss) sees either the old content
// or the new, never a torn file.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotDurable wraps a failure after the rename: the new content is in
// place (a reader sees it) but the directory entry may not survive a crash.
// Callers keep their memory in step with the file, so they treat it as
// written.
var ErrNotDurable = errors.New("atomicfile: written but not known to be durable")

// tempPattern is the temp file of a Write of name: <name>.tmp-<random>.
func tempPattern(name string) string { return name + ".tmp-*" }

// Write replaces dir/name with data: a temp file in the same directory,
// fsync, rename over the old file, fsync the directory. A crash (kill -9,
// power loss) may leave the temp file behind: SweepTemps removes it.
func Write(dir, name string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(dir, tempPattern(name))
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("atomicfile: %s: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("atomicfile: %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("atomicfile: %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("atomicfile: %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%w: fsync %s: %w", ErrNotDurable, dir, err)
	}
	return nil
}

// MoveAside renames a file that could not be read to path.corrupt-<suffix>,
// keeping it for a person to look at, and returns the new path.
func MoveAside(path string, suffix int64) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%d", path, suffix)
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, nil
}

// SweepTemps removes the temp files that interrupted Writes of the named
// files left in dir (regular files named <name>.tmp-*, nothing else) and
// returns their paths. Call it at start, before any Write of those names.
func SweepTemps(dir string, names ...string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("atomicfile: sweep %s: %w", dir, err)
	}
	var removed []string
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		for _, name := range names {
			if strings.HasPrefix(e.Name(), strings.TrimSuffix(tempPattern(name), "*")) {
				p := filepath.Join(dir, e.Name())
				if err := os.Remove(p); err != nil {
					return removed, fmt.Errorf("atomicfile: sweep: %w", err)
				}
				removed = append(removed, p)
				break
			}
		}
	}
	return removed, nil
}

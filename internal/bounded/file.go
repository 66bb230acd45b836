package bounded

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Size caps of the reads statsd makes. Kernel stat files are far smaller
// than MaxFileBytes; cgroup.procs of a large sandbox is the largest file
// read. A pid file holds one number.
const (
	MaxFileBytes    = 1 << 20
	MaxPIDFileBytes = 64
)

// ErrNotRegular marks a path that is not a regular file where one is needed
// (a FIFO, a device, a directory, a symlink).
var ErrNotRegular = errors.New("not a regular file")

// ReadFile opens path and reads it whole, at most max bytes; a larger file
// is an error wrapping source.ErrMalformed. It blocks (a FIFO with no writer
// blocks forever): callers run it under a Group.
func ReadFile(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllLimited(f, path, max)
}

// ReadRegularFile reads a file someone else may have placed (a pid file
// named by the launcher, a state file): it refuses anything but a regular
// file without opening it for long, never follows a symlink in the last
// element, never blocks on a FIFO, and reads at most max bytes. The error of
// a refused file names the path and what it is, never its content.
func ReadRegularFile(path string, max int) ([]byte, error) {
	if fi, err := os.Lstat(path); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, typeName(fi.Mode()))
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() { // replaced between the Lstat and the open
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, typeName(fi.Mode()))
	}
	return readAllLimited(f, path, max)
}

func typeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	default:
		return "not a regular file"
	}
}

func readAllLimited(r io.Reader, path string, max int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", source.ErrMalformed, path, max)
	}
	return b, nil
}

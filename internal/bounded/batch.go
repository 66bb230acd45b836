package bounded

// This file is the batched read: the small files of one sample, each a name
// in a directory held open, read one after another into one buffer inside a
// single bounded call.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// batchMinBytes is the smallest buffer a Batch starts with: the files of one
// cgroup sample (a memory.stat of about 1 KiB and a dozen one-line files)
// fit in it.
const batchMinBytes = 4 << 10

// Batch reads small files, each a name in a directory held open, one after
// another into one buffer: per file an openat relative to the directory, an
// fstat that refuses anything but a regular file, reads into the buffer and
// a close; no allocation per file. What Read returns stays valid and
// unchanged for as long as it is referenced: the Batch only appends (a full
// buffer is replaced by a larger one, never written over).
//
// A Batch belongs to one call of DoBatch, which bounds it: a read that
// blocks (a FIFO with no writer where a kernel file should be) costs the
// callers the deadline, and the deadline's error names the file the batch
// is blocked in.
type Batch struct {
	buf   []byte
	total int    // bytes of the files read whole
	cname []byte // the name being opened, NUL-terminated (reused)

	mu      sync.Mutex // guards the file in progress, read by a caller at its deadline
	curDir  *os.File
	curName string
}

// Read reads name in the open directory dir, at most limit bytes (0 means
// MaxFileBytes); a larger file is an error wrapping source.ErrMalformed.
// name is one path element: the open never follows a symlink and never
// leaves dir. A file that is not a regular file is refused with
// ErrNotRegular (after opening it: an open that blocks is the deadline's to
// bound). Errors name the path; fs.ErrNotExist stays detectable with
// errors.Is.
func (b *Batch) Read(dir *os.File, name string, limit int) ([]byte, error) {
	return b.read(dir, name, limit, readOpts{})
}

// pidListEnd: a read of a kernfs pid list (cgroup.procs, cgroup.threads,
// tasks) shorter than its room and than this ends the file. seq_file gives
// a read the records that fit its buffer (at least a page, 4096 bytes) and
// stops short only when the next record does not fit: a pid's record is at
// most 8 bytes ("4194304\n", pid_max's ceiling), so a short read that
// stopped at the buffer's end returned more than 4096-8 bytes.
const pidListEnd = 4096 - 64

// ReadPidList is Read for a kernfs pid list (cgroup.procs, cgroup.threads,
// tasks) in dir, a directory of a cgroup file system: a read short of its
// room and of pidListEnd bytes ends the file, so a list of fewer than about
// 500 pids takes one read, not two; and the file opened is not checked to
// be a regular file (kernfs makes no FIFO or device, and a cgroup cannot
// be named as a control file: a pid list's name is always the kernel's
// file).
func (b *Batch) ReadPidList(dir *os.File, name string, limit int) ([]byte, error) {
	return b.read(dir, name, limit, readOpts{shortEnds: pidListEnd, kernfs: true})
}

// readOpts are what a read may assume of its file.
type readOpts struct {
	// shortEnds: a read short of its room and of this many bytes ends the
	// file (0: only a read of 0 bytes does).
	shortEnds int
	// kernfs: the directory is on a cgroup file system; the file opened is
	// not checked to be a regular file.
	kernfs bool
}

// read is Read and ReadPidList.
func (b *Batch) read(dir *os.File, name string, limit int, o readOpts) ([]byte, error) {
	fd := -1
	data, err := b.readKeep(dir, name, limit, &fd, o)
	if fd >= 0 {
		syscall.Close(fd)
	}
	return data, err
}

// ErrHeldGone marks a read of a kept descriptor (ReadKeep) that the kernel
// refused with ENODEV: the kernfs file it names was removed (its cgroup was
// removed, perhaps made again under the same path). It wraps fs.ErrNotExist,
// so a caller that checks whether the directory is still the one it holds
// does so.
var ErrHeldGone = fmt.Errorf("kept file removed: %w", fs.ErrNotExist)

// ReadKeep is Read that keeps the file open for the next read. With *fd < 0
// it opens name in dir as Read does (one name, no symlink, a regular file
// only) and, when the read succeeds, leaves the open descriptor in *fd: the
// caller owns it (it closes it, or passes it back here). With *fd >= 0 it
// reads that descriptor from offset 0 (pread) without opening anything: a
// kernfs file (a cgroup's) regenerates its content on a read from offset 0.
// On any error *fd is closed and set to -1; a kept descriptor whose kernfs
// file was removed fails with an error wrapping ErrHeldGone (and
// fs.ErrNotExist). The caller must use a descriptor in one read at a time,
// and must keep only descriptors of files that cannot be replaced under the
// same name (kernfs: its files cannot be renamed or unlinked).
//
// A read shorter than the room it was given ends the file: no read at the
// end to see 0 bytes (half of a sample's reads). That holds for a regular
// file and for a kernfs file shown as one record (every cgroup file but the
// pid lists, cgroup.procs, cgroup.threads and tasks, which print a record a
// pid and may stop short at a page's end: read those with ReadPidList): seq_file
// shows the one record whole into its buffer, growing it until it fits, and
// gives the reader as much of it as the reader asked.
func (b *Batch) ReadKeep(dir *os.File, name string, limit int, fd *int) ([]byte, error) {
	return b.readKeep(dir, name, limit, fd, readOpts{shortEnds: math.MaxInt})
}

// readKeep is ReadKeep with what the read may assume of its file.
func (b *Batch) readKeep(dir *os.File, name string, limit int, fd *int, o readOpts) ([]byte, error) {
	if limit <= 0 {
		limit = MaxFileBytes
	}
	if name == "" || name == "." || name == ".." || strings.IndexByte(name, '/') >= 0 {
		if *fd >= 0 {
			syscall.Close(*fd)
			*fd = -1
		}
		return nil, fmt.Errorf("%s/%s: not a name in the directory", dir.Name(), name)
	}
	b.mu.Lock()
	b.curDir, b.curName = dir, name
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.curDir, b.curName = nil, ""
		b.mu.Unlock()
	}()

	kept := *fd >= 0
	if !kept {
		f, err := b.openRegular(dir, name, o.kernfs)
		if err != nil {
			return nil, err
		}
		*fd = f
	}
	data, err := b.readAt0(*fd, dir, name, limit, o.shortEnds)
	if err != nil {
		syscall.Close(*fd)
		*fd = -1
		if kept && errors.Is(err, syscall.ENODEV) {
			return nil, fmt.Errorf("read %s/%s: %w: %w", dir.Name(), name, ErrHeldGone, syscall.ENODEV)
		}
		return nil, err
	}
	return data, nil
}

// openRegular opens name in dir (never following a symlink, never leaving
// dir) and refuses anything but a regular file; kernfs: dir is on a cgroup
// file system, whose files are the kernel's (no fstat to check).
func (b *Batch) openRegular(dir *os.File, name string, kernfs bool) (int, error) {
	fd, err := b.openat(dir, name)
	if err != nil {
		return -1, &fs.PathError{Op: "openat", Path: dir.Name() + "/" + name, Err: err}
	}
	if kernfs {
		return fd, nil
	}
	var st syscall.Stat_t
	if err := retryEINTR(func() error { return syscall.Fstat(fd, &st) }); err != nil {
		syscall.Close(fd)
		return -1, &fs.PathError{Op: "fstat", Path: dir.Name() + "/" + name, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return -1, fmt.Errorf("%s/%s: %w (%s)", dir.Name(), name, ErrNotRegular, typeName(fileMode(uint32(st.Mode))))
	}
	return fd, nil
}

// readAt0 reads fd whole from offset 0 into the buffer, at most limit
// bytes; a read short of its room and of shortEnds bytes ends the file.
func (b *Batch) readAt0(fd int, dir *os.File, name string, limit, shortEnds int) ([]byte, error) {
	start := len(b.buf)
	for {
		if len(b.buf) == cap(b.buf) {
			// Full: a buffer twice as large takes the file in progress;
			// what earlier reads returned stays in the old one.
			nb := make([]byte, len(b.buf)-start, max(2*cap(b.buf), batchMinBytes))
			copy(nb, b.buf[start:])
			b.buf, start = nb, 0
		}
		// At most limit+1 bytes of this file: one more than limit says it is
		// too large.
		room := b.buf[len(b.buf):min(cap(b.buf), start+limit+1)]
		var n int
		err := retryEINTR(func() (err error) {
			n, err = syscall.Pread(fd, room, int64(len(b.buf)-start))
			return err
		})
		if err != nil {
			b.buf = b.buf[:start]
			return nil, fmt.Errorf("read %s/%s: %w", dir.Name(), name, err)
		}
		if n == 0 {
			break
		}
		b.buf = b.buf[:len(b.buf)+n]
		if len(b.buf)-start > limit {
			b.buf = b.buf[:start]
			return nil, fmt.Errorf("%w: %s/%s is larger than %d bytes", source.ErrMalformed, dir.Name(), name, limit)
		}
		if n < len(room) && n < shortEnds {
			break
		}
	}
	b.total += len(b.buf) - start
	// The full slice expression keeps a caller's append from writing into
	// the next file.
	return b.buf[start:len(b.buf):len(b.buf)], nil
}

// Len returns how many bytes the batch has read so far: a size hint for the
// next batch of the same files.
func (b *Batch) Len() int { return b.total }

// current names the file the batch is reading now ("" between files).
func (b *Batch) current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.curDir == nil {
		return ""
	}
	return b.curDir.Name() + "/" + b.curName
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// fileMode turns a stat mode's type bits into an fs.FileMode (for
// typeName).
func fileMode(m uint32) fs.FileMode {
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	case syscall.S_IFIFO:
		return fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return fs.ModeSocket
	case syscall.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return fs.ModeDevice
	}
	return fs.ModeIrregular
}

// DoBatch is Do for a batch of file reads: fn reads them through one Batch
// (whose buffer starts at sizeHint bytes, at least 4 KiB), in the one call
// that every caller of key shares. A caller that gives up at the deadline
// gets an error wrapping source.ErrTimeout that names the file the batch is
// blocked in.
func DoBatch[T any](ctx context.Context, g *Group, key string, sizeHint int, fn func(b *Batch) (T, error)) (T, error) {
	return do[T](ctx, g, key, func(c *call) func() (any, error) {
		c.batch = &Batch{buf: make([]byte, 0, max(sizeHint, batchMinBytes))}
		return func() (any, error) { return fn(c.batch) }
	})
}

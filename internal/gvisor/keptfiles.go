// This file keeps a cgroup directory's files open between samples: each is
// opened (through the directory held inside its root, checked to be a
// regular file) at its first read and then read with pread at offset 0,
// saving the open, fstat and close of every sample (about 60 syscalls a
// sample, 37% of statsd's CPU under load).

package gvisor

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// maxKeptPerDir bounds the files kept open in one cgroup directory; a sample
// reads at most 9 in one (v2: memory, cpu and the signal files).
const maxKeptPerDir = 16

// keptFiles are the files kept open in one cgroup directory (guarded by
// cgroupSource.mu, as the dirHandle holding them). Only a directory on a
// cgroup file system (kernfs) keeps files: its files cannot be renamed or
// unlinked, a read from offset 0 regenerates their content, and a read of a
// removed cgroup's file fails with ENODEV (verified on this host's v1 and
// v2 hierarchies for every file read; see docs/gvisor.md). Elsewhere a file
// could be replaced under its name and a kept descriptor would read the old
// one, so each read opens the file.
type keptFiles struct {
	slots  []keptSlot
	closed bool // the directory was closed: a descriptor given back is closed
}

type keptSlot struct {
	name string
	fd   int  // -1: none kept (or taken)
	out  bool // taken by a read in progress
}

// keepable says whether name may be kept open: cgroup.procs and tasks may
// not (v1 builds their pid list once per open file and serves it again to
// a read from offset 0 for up to a second; v2's keeps a task iterator).
func keepable(name string) bool { return name != "cgroup.procs" && name != "tasks" }

// newKeptFiles returns the kept files of dir, nil when dir's files must be
// opened at each read (not a cgroup file system).
func newKeptFiles(dir *os.File) *keptFiles {
	if !onCgroupFS(dir) {
		return nil
	}
	return &keptFiles{}
}

// keptBudget bounds the descriptors kept by every source of the process:
// an eighth of RLIMIT_NOFILE (within the quarter statsd keeps from the read
// connections for its own files), so a read past it opens and closes its
// file as before. It counts kept cgroup files only: each source's held
// cgroup directories (about 7), its held /proc/<pid> (pinDir) and its kept
// sentry connection are outside it, a few per workload.
var keptBudget = sync.OnceValue(func() int64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 0
	}
	return int64(min(rl.Cur/8, 1<<20))
})

// keptOpen counts the descriptors kept (or taken) in every keptFiles.
var keptOpen atomic.Int64

// take returns the descriptor kept for name and marks it taken (only one
// read uses a descriptor at a time: a read hung in the kernel never holds
// up another's), or -1.
func (k *keptFiles) take(name string) (fd int, taken bool) {
	for i := range k.slots {
		if sl := &k.slots[i]; sl.name == name {
			if sl.fd < 0 || sl.out {
				return -1, false
			}
			fd, sl.fd, sl.out = sl.fd, -1, true
			return fd, true
		}
	}
	return -1, false
}

// giveBack ends a read of name that left fd (-1: none, or closed on an
// error); taken says it was take's. The descriptor is kept when there is a
// slot and budget for it, closed otherwise.
func (k *keptFiles) giveBack(name string, fd int, taken bool) {
	var sl *keptSlot
	for i := range k.slots {
		if k.slots[i].name == name {
			sl = &k.slots[i]
			break
		}
	}
	if taken {
		sl.out = false
		switch {
		case fd < 0:
			keptOpen.Add(-1)
		case k.closed:
			syscall.Close(fd)
			keptOpen.Add(-1)
		default:
			sl.fd = fd
		}
		return
	}
	if fd < 0 {
		return
	}
	keep := !k.closed && ((sl == nil && len(k.slots) < maxKeptPerDir) || (sl != nil && sl.fd < 0 && !sl.out))
	if keep && keptOpen.Add(1) > keptBudget() {
		keptOpen.Add(-1)
		keep = false
	}
	if !keep {
		syscall.Close(fd)
		return
	}
	if sl == nil {
		k.slots = append(k.slots, keptSlot{name: name, fd: fd})
		return
	}
	sl.fd = fd
}

// closeAll closes the kept descriptors; one taken is closed when given back.
func (k *keptFiles) closeAll() {
	if k == nil {
		return
	}
	k.closed = true
	for i := range k.slots {
		if sl := &k.slots[i]; sl.fd >= 0 {
			syscall.Close(sl.fd)
			sl.fd = -1
			keptOpen.Add(-1)
		}
	}
}

// readFile reads name in h's directory through b: from the descriptor kept
// for it when there is one, else opening it (and keeping it when it may be).
// A file read empty is not kept (io.stat of a cgroup without I/O): a kernel
// older than seq_file's reset of its iterator on a read from offset 0 would
// serve a kept one empty again, its position not having moved.
func (s *cgroupSource) readFile(b *bounded.Batch, h *dirHandle, name string) ([]byte, error) {
	if h.kept == nil {
		return b.Read(h.f, name, bounded.MaxFileBytes)
	}
	if !keepable(name) { // a pid list on a cgroup file system
		return b.ReadPidList(h.f, name, bounded.MaxFileBytes)
	}
	s.mu.Lock()
	fd, taken := h.kept.take(name)
	s.mu.Unlock()
	data, err := b.ReadKeep(h.f, name, bounded.MaxFileBytes, &fd)
	if err == nil && len(data) == 0 && fd >= 0 {
		syscall.Close(fd)
		fd = -1
	}
	s.mu.Lock()
	h.kept.giveBack(name, fd, taken)
	s.mu.Unlock()
	return data, err
}

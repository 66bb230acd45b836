package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// TestKeptFiles walks one directory's kept files through the cases: a
// descriptor kept and taken, one read at a time, a failed read giving its
// slot up, the per-directory bound, and the close of the directory (a
// descriptor taken meanwhile is closed when given back).
func TestKeptFiles(t *testing.T) {
	dir := t.TempDir()
	open := func() int {
		t.Helper()
		fd, err := syscall.Open(filepath.Join(dir, "f"), syscall.O_RDONLY|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	isOpen := func(fd int) bool {
		var st syscall.Stat_t
		return !errors.Is(syscall.Fstat(fd, &st), syscall.EBADF)
	}
	base := keptOpen.Load()
	k := &keptFiles{}

	if fd, taken := k.take("a"); fd != -1 || taken {
		t.Fatalf("take of a name never kept = %d, %v", fd, taken)
	}
	a := open()
	k.giveBack("a", a, false)
	fd, taken := k.take("a")
	if fd != a || !taken {
		t.Fatalf("take = %d, %v; want the kept %d", fd, taken, a)
	}
	// Taken: a concurrent read opens its own, which is not kept beside it.
	if fd2, taken2 := k.take("a"); fd2 != -1 || taken2 {
		t.Fatalf("second take while taken = %d, %v", fd2, taken2)
	}
	other := open()
	k.giveBack("a", other, false)
	if isOpen(other) && other != a {
		t.Errorf("a second descriptor for a taken name was kept, not closed")
	}
	k.giveBack("a", a, true)
	if got := keptOpen.Load() - base; got != 1 {
		t.Errorf("kept = %d, want 1", got)
	}
	// A failed read (ReadKeep closed it: -1) gives the slot up.
	fd, _ = k.take("a")
	syscall.Close(fd)
	k.giveBack("a", -1, true)
	if got := keptOpen.Load() - base; got != 0 {
		t.Errorf("after a failed read: kept = %d, want 0", got)
	}
	// The bound: past maxKeptPerDir names (a's slot is one), a descriptor
	// is closed.
	for i := range maxKeptPerDir + 2 {
		fd := open()
		k.giveBack(string(rune('b'+i)), fd, false)
	}
	if got := keptOpen.Load() - base; got != maxKeptPerDir-1 {
		t.Errorf("kept = %d after %d more names, want %d (the bound less a's slot)", got, maxKeptPerDir+2, maxKeptPerDir-1)
	}
	// Close with one taken: the others close now, the taken one when given back.
	taken1, _ := k.take("b")
	k.closeAll()
	if got := keptOpen.Load() - base; got != 1 {
		t.Errorf("after closeAll with one taken: kept = %d, want 1", got)
	}
	k.giveBack("b", taken1, true)
	if got := keptOpen.Load() - base; got != 0 {
		t.Errorf("after the taken one came back: kept = %d, want 0", got)
	}
	late := open()
	k.giveBack("zz", late, false)
	if got := keptOpen.Load() - base; got != 0 {
		t.Errorf("a descriptor given to a closed directory was kept (%d)", got)
	}
	_ = os.Remove(filepath.Join(dir, "f"))
}

// TestKeepable: the pid lists are never kept (v1 serves a kept cgroup.procs
// its old list again for up to a second: checked on this host).
func TestKeepable(t *testing.T) {
	for name, want := range map[string]bool{"cgroup.procs": false, "tasks": false, "memory.stat": true, "cpu.pressure": true} {
		if got := keepable(name); got != want {
			t.Errorf("keepable(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestReadFileKeeps: through a directory handle that keeps files, a file is
// kept after its first read and read again from the kept descriptor (its
// new content), cgroup.procs and an empty file are not kept, and a missing
// file keeps nothing.
func TestReadFileKeeps(t *testing.T) {
	dirPath := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dirPath, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("memory.stat", "cache 1\n")
	write("cgroup.procs", "42\n")
	write("io.stat", "")
	f, err := os.Open(dirPath)
	if err != nil {
		t.Fatal(err)
	}
	s := &cgroupSource{}
	h := &dirHandle{f: f, kept: &keptFiles{}}
	defer func() {
		s.mu.Lock()
		h.closeLocked()
		s.mu.Unlock()
	}()
	read := func(name string) string {
		t.Helper()
		data, err := s.readFile(&bounded.Batch{}, h, name)
		if err != nil {
			t.Fatalf("readFile %s: %v", name, err)
		}
		return string(data)
	}
	base := keptOpen.Load()
	for _, name := range []string{"memory.stat", "cgroup.procs", "io.stat"} {
		read(name)
	}
	if _, err := s.readFile(&bounded.Batch{}, h, "missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("readFile of a missing file: %v, want ErrNotExist", err)
	}
	var names []string
	for _, sl := range h.kept.slots {
		if sl.fd >= 0 {
			names = append(names, sl.name)
		}
	}
	if diff := cmp.Diff([]string{"memory.stat"}, names); diff != "" {
		t.Errorf("kept files (-want +got):\n%s", diff)
	}
	if got := keptOpen.Load() - base; got != 1 {
		t.Errorf("kept = %d, want 1", got)
	}
	write("memory.stat", "cache 22\n") // in place: the kept descriptor sees it
	if got := read("memory.stat"); got != "cache 22\n" {
		t.Errorf("second read = %q, want the new content", got)
	}
}

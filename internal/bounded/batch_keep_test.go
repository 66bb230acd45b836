package bounded

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestBatchReadKeep: a file opened once and read again from offset 0 through
// the kept descriptor; what happens to the descriptor on each outcome.
func TestBatchReadKeep(t *testing.T) {
	big := strings.Repeat("4211\n", 2000) // past the first buffer: preads at growing offsets
	tests := []struct {
		name    string
		file    string // the file's first content ("" with noFile: none)
		noFile  bool
		symlink bool
		between func(t *testing.T, path string) // after the first read
		limit   int
		// second read's outcome
		want     string
		wantErr  string // a substring; "" for none
		notExist bool   // the error is fs.ErrNotExist
		kept     bool   // the descriptor is still kept after the second read
	}{
		{name: "rewritten in place is read again", file: "1\n", between: rewrite("22\n"), want: "22\n", kept: true},
		{name: "grown past the buffer", file: "1\n", between: rewrite(big), want: big, kept: true},
		{name: "shrunk", file: big, between: rewrite("3\n"), want: "3\n", kept: true},
		// Outside kernfs a kept descriptor reads the file it was opened on:
		// why callers keep only a cgroup file system's files.
		{name: "replaced by rename reads the old file", file: "old\n", between: replace("new\n"), want: "old\n", kept: true},
		{name: "removed reads the unlinked file", file: "old\n", between: remove, want: "old\n", kept: true},
		{name: "past the bound: malformed, closed", file: "1\n", between: rewrite(strings.Repeat("x", 100)), limit: 10,
			wantErr: "larger than 10 bytes"},
		{name: "missing: nothing kept", noFile: true, wantErr: "no such file", notExist: true},
		{name: "symlink refused: nothing kept", symlink: true, wantErr: "openat", notExist: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dirPath := t.TempDir()
			path := filepath.Join(dirPath, "f")
			switch {
			case tc.symlink:
				if err := os.WriteFile(filepath.Join(dirPath, "target"), []byte("1\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("target", path); err != nil {
					t.Fatal(err)
				}
			case !tc.noFile:
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			dir, err := os.Open(dirPath)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			fd := -1
			defer func() {
				if fd >= 0 {
					syscall.Close(fd)
				}
			}()
			b := &Batch{}
			first, err := b.ReadKeep(dir, "f", tc.limit, &fd)
			if tc.noFile || tc.symlink {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, fs.ErrNotExist) != tc.notExist {
					t.Fatalf("ReadKeep = %q, %v; want an error with %q (not exist %v)", first, err, tc.wantErr, tc.notExist)
				}
				if fd != -1 {
					t.Fatalf("fd = %d after a failed open, want -1", fd)
				}
				return
			}
			if err != nil || string(first) != tc.file || fd < 0 {
				t.Fatalf("first ReadKeep = %q, %v (fd %d); want %q and a kept descriptor", first, err, fd, tc.file)
			}
			tc.between(t, path)
			got, err := b.ReadKeep(dir, "f", tc.limit, &fd)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("second ReadKeep = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				if !errors.Is(err, source.ErrMalformed) {
					t.Errorf("error %v does not wrap ErrMalformed", err)
				}
			} else if err != nil {
				t.Fatalf("second ReadKeep: %v", err)
			}
			if diff := cmp.Diff(tc.want, string(got)); diff != "" {
				t.Errorf("second read (-want +got):\n%s", diff)
			}
			if (fd >= 0) != tc.kept {
				t.Errorf("fd = %d after the second read, want kept %v", fd, tc.kept)
			}
			// The first read's bytes are unchanged (the batch only appends).
			if string(first) != tc.file {
				t.Errorf("first read changed to %q", first)
			}
		})
	}
}

// TestBatchReadKeepErrorClosesDescriptor: a kept descriptor whose read fails
// is closed and given up (here a directory's descriptor passed as kept: EISDIR).
func TestBatchReadKeepErrorClosesDescriptor(t *testing.T) {
	dirPath := t.TempDir()
	dir, err := os.Open(dirPath)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fd, err := syscall.Open(dirPath, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	held := fd
	b := &Batch{}
	if got, err := b.ReadKeep(dir, "f", 0, &fd); err == nil || errors.Is(err, ErrHeldGone) {
		t.Fatalf("ReadKeep of a directory descriptor = %q, %v; want a read error, not ErrHeldGone", got, err)
	}
	if fd != -1 {
		t.Fatalf("fd = %d after a failed read, want -1", fd)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(held, &st); !errors.Is(err, syscall.EBADF) {
		t.Errorf("the failed descriptor is still open (fstat: %v)", err)
	}
}

func rewrite(data string) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func replace(data string) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		t.Helper()
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestBatchReadPidList: a pid list read whole however its reads end: one
// under a page (a short read ends it) and one over a page (reads until 0).
func TestBatchReadPidList(t *testing.T) {
	var long strings.Builder
	for pid := 4194304; long.Len() < 3*4096; pid-- {
		long.WriteString(strconv.Itoa(pid) + "\n")
	}
	for name, content := range map[string]string{"empty": "", "short": "1\n42\n", "over a page": long.String()} {
		t.Run(name, func(t *testing.T) {
			dirPath := t.TempDir()
			if err := os.WriteFile(filepath.Join(dirPath, "cgroup.procs"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			dir, err := os.Open(dirPath)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			var b Batch
			got, err := b.ReadPidList(dir, "cgroup.procs", 0)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(content, string(got)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

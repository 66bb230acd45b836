package bounded

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// batchDir makes a directory like a cgroup's (small files, a large one, a
// subdirectory, a symlink leading out) beside a file it must not reach, and
// returns it open.
func batchDir(t *testing.T) *os.File {
	t.Helper()
	top := t.TempDir()
	dir := filepath.Join(top, "cg")
	for name, data := range map[string]string{
		"../secret":             "secret\n",
		"memory.usage_in_bytes": "4096\n",
		"memory.stat":           strings.Repeat("total_cache 0\n", 100),
		"empty":                 "",
		"cgroup.procs":          strings.Repeat("4211\n", 2000), // 10,000 bytes: past the first buffer
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../secret", filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestBatchRead(t *testing.T) {
	dir := batchDir(t)
	type result struct {
		Data    string
		Err     string // a substring of the error
		NotFile bool   // errors.Is ErrNotRegular
		Missing bool   // errors.Is fs.ErrNotExist
		TooBig  bool   // errors.Is source.ErrMalformed
	}
	for _, tc := range []struct {
		name  string
		file  string
		limit int
		want  result
	}{
		{name: "one-line file", file: "memory.usage_in_bytes", want: result{Data: "4096\n"}},
		{name: "empty file", file: "empty", want: result{}},
		{name: "missing file", file: "memory.peak", want: result{Err: "cg/memory.peak", Missing: true}},
		{name: "a directory", file: "child", want: result{Err: "cg/child: not a regular file (a directory)", NotFile: true}},
		{name: "symlink not followed", file: "escape", want: result{Err: "cg/escape"}},
		{name: "parent refused", file: "../secret", want: result{Err: "not a name in the directory"}},
		{name: "path refused", file: "child/x", want: result{Err: "not a name in the directory"}},
		{name: "over the limit", file: "memory.stat", limit: 100, want: result{Err: "cg/memory.stat is larger than 100 bytes", TooBig: true}},
		{name: "at the limit", file: "memory.usage_in_bytes", limit: 5, want: result{Data: "4096\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			data, err := b.Read(dir, tc.file, tc.limit)
			got := result{Data: string(data)}
			if err != nil {
				got = result{Err: tc.want.Err, NotFile: errors.Is(err, ErrNotRegular), Missing: errors.Is(err, fs.ErrNotExist),
					TooBig: errors.Is(err, source.ErrMalformed)}
				if tc.want.Err == "" || !strings.Contains(err.Error(), tc.want.Err) {
					got.Err = err.Error()
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Read(%q) (-want +got):\n%s", tc.file, diff)
			}
		})
	}
}

// TestBatchKeepsEarlierFiles: the files of one batch share its buffer; a
// file that outgrows it (cgroup.procs) moves on to a larger one, and what
// the earlier reads returned is neither moved nor written over, nor
// overwritten by a caller appending to it.
func TestBatchKeepsEarlierFiles(t *testing.T) {
	dir := batchDir(t)
	var b Batch
	var got [][]byte
	names := []string{"memory.usage_in_bytes", "memory.stat", "cgroup.procs", "memory.usage_in_bytes"}
	for _, n := range names {
		data, err := b.Read(dir, n, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, data)
	}
	_ = append(got[0], "garbage"...) // must not reach the next file
	for i, n := range names {
		want, err := os.ReadFile(filepath.Join(dir.Name(), n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[i], want) {
			t.Errorf("file %d (%s): %d bytes %.20q..., want %d bytes %.20q...", i, n, len(got[i]), got[i], len(want), want)
		}
	}
	if want := 5 + 1400 + 10000 + 5; b.Len() != want {
		t.Errorf("Len = %d, want %d", b.Len(), want)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := b.Read(dir, "memory.usage_in_bytes", 0); err != nil {
			t.Fatal(err)
		}
	}); allocs > 0 {
		t.Errorf("a read allocates %v times, want 0", allocs)
	}
}

// TestDoBatchNamesHungFile: a FIFO with no writer where a kernel file should
// be blocks the batch in its open. The caller gets ErrTimeout at the bound,
// naming that file; a second caller joins the hung batch.
func TestDoBatchNamesHungFile(t *testing.T) {
	dir := batchDir(t)
	fifo := filepath.Join(dir.Name(), "memory.current")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	g := New(100 * time.Millisecond)
	t.Cleanup(func() { // unblock the hung open and let the batch end before dir closes
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		for deadline := time.Now().Add(5 * time.Second); g.InFlight() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	})
	read := func() error {
		_, err := DoBatch(context.Background(), g, "sample", 0, func(b *Batch) (int, error) {
			if _, err := b.Read(dir, "memory.usage_in_bytes", 0); err != nil {
				return 0, err
			}
			_, err := b.Read(dir, "memory.current", 0)
			return 0, err
		})
		return err
	}
	for i := range 2 {
		err := read()
		if !errors.Is(err, source.ErrTimeout) || !strings.Contains(err.Error(), "cg/memory.current") {
			t.Errorf("call %d: err = %v, want ErrTimeout naming cg/memory.current", i, err)
		}
	}
	if n := g.InFlight(); n != 1 {
		t.Errorf("in-flight calls = %d, want the 1 hung batch", n)
	}
}

package gvisor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStateCache: a state file is read again only when its (size, mtime)
// changed, the root listed again only when its own did, and neither is
// trusted while its mtime is within the racy window.
func TestStateCache(t *testing.T) {
	root := getRunscRoot(t, nil)
	old := time.Now().Add(-time.Hour)
	age := func(p string, at time.Time) {
		t.Helper()
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	busy := filepath.Join(root, "gvx-busy_sandbox:gvx-sbx.state")
	for n := range stateFixtures {
		age(filepath.Join(root, n), old)
	}
	age(root, old)
	c := newStateCache()
	find := func() (runscSandbox, error) {
		sb, _, err := c.findSandbox([]string{root}, "", 21385, "")
		return sb, err
	}
	if sb, err := find(); err != nil || len(sb.Containers) != 2 {
		t.Fatalf("first read: %+v, %v", sb, err)
	}

	// The same size and mtime: the cached parse, the new bytes unread.
	b, _ := os.ReadFile(busy)
	os.WriteFile(busy, bytes.Replace(b, []byte(`"busy"`), []byte(`"BUSY"`), 1), 0o640)
	age(busy, old)
	if sb, err := find(); err != nil || sb.Containers[1].Name != "busy" {
		t.Errorf("unchanged (size, mtime): %+v, %v; want the cached name busy", sb.Containers, err)
	}
	// Another mtime: read again.
	age(busy, old.Add(time.Second))
	if sb, err := find(); err != nil || sb.Containers[1].Name != "BUSY" {
		t.Errorf("another mtime: %+v, %v; want BUSY read again", sb.Containers, err)
	}

	// A file added with the root's (size, mtime) kept: the cached listing
	// (where a directory's size does not count its entries, as on ext4).
	before, _ := os.Stat(root)
	extra := filepath.Join(root, "gvx-new_sandbox:gvx-sbx.state")
	os.WriteFile(extra, bytes.ReplaceAll(b, []byte(`"gvx-busy"`), []byte(`"gvx-new"`)), 0o640)
	age(extra, old)
	fi, _ := os.Stat(root)
	age(root, old)
	if sb, _ := find(); fi.Size() == before.Size() && len(sb.Containers) != 2 {
		t.Errorf("root unchanged: %d containers, want the cached listing's 2 (root size %d)", len(sb.Containers), fi.Size())
	}
	age(root, old.Add(time.Second))
	if sb, _ := find(); len(sb.Containers) != 3 {
		t.Errorf("root changed: %d containers, want 3", len(sb.Containers))
	}

	// Within the racy window nothing is trusted: a same-size change with
	// the same recent mtime is seen.
	now := time.Now()
	age(busy, now)
	c.read(root, filepath.Base(busy))
	os.WriteFile(busy, b, 0o640)
	age(busy, now)
	if st, err := c.read(root, filepath.Base(busy)); err != nil || st.Name != "busy" {
		t.Errorf("recent file: %+v, %v; want it read again", st, err)
	}
}

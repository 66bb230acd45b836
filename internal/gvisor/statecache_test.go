package gvisor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStateCache: a state file is read again only when its (size, mtime,
// ctime) changed, the root listed again only when its own did, and neither
// is trusted while its mtime is within the racy window. Every file is
// statted at every read (trustFor 0; TestStateCacheTrust has the rest).
func TestStateCache(t *testing.T) {
	root, busy, old, age := agedRunscRoot(t)
	c := newStateCache()
	c.trustFor = 0
	find := func() (runscSandbox, error) {
		sb, _, err := c.findSandbox([]string{root}, "", 21385, "")
		return sb, err
	}
	if sb, err := find(); err != nil || len(sb.Containers) != 2 {
		t.Fatalf("first read: %+v, %v", sb, err)
	}

	// Unchanged: the cached parse.
	if sb, err := find(); err != nil || sb.Containers[1].Name != "busy" {
		t.Errorf("unchanged: %+v, %v; want the cached name busy", sb.Containers, err)
	}
	// The same size and mtime, rewritten: its ctime moved, read again.
	b, _ := os.ReadFile(busy)
	os.WriteFile(busy, bytes.Replace(b, []byte(`"busy"`), []byte(`"BUSY"`), 1), 0o640)
	age(busy, old)
	if sb, err := find(); err != nil || sb.Containers[1].Name != "BUSY" {
		t.Errorf("same (size, mtime), new ctime: %+v, %v; want BUSY read again", sb.Containers, err)
	}
	// Another mtime: read again.
	age(busy, old.Add(time.Second))
	if sb, err := find(); err != nil || sb.Containers[1].Name != "BUSY" {
		t.Errorf("another mtime: %+v, %v; want BUSY read again", sb.Containers, err)
	}

	// A file added with the root's (size, mtime) kept: its ctime moved,
	// listed again.
	extra := filepath.Join(root, "gvx-new_sandbox:gvx-sbx.state")
	os.WriteFile(extra, bytes.ReplaceAll(b, []byte(`"gvx-busy"`), []byte(`"gvx-new"`)), 0o640)
	age(extra, old)
	age(root, old)
	if sb, _ := find(); len(sb.Containers) != 3 {
		t.Errorf("root's (size, mtime) kept, ctime moved: %d containers, want 3", len(sb.Containers))
	}
	age(root, old.Add(time.Second))
	if sb, _ := find(); len(sb.Containers) != 3 {
		t.Errorf("root changed: %d containers, want 3", len(sb.Containers))
	}

	// Within the racy window nothing is trusted: a same-size change with
	// the same recent mtime is seen.
	now := time.Now()
	age(busy, now)
	c.read(root, filepath.Base(busy), false)
	os.WriteFile(busy, b, 0o640)
	age(busy, now)
	if st, err := c.read(root, filepath.Base(busy), false); err != nil || st.Name != "busy" {
		t.Errorf("recent file: %+v, %v; want it read again", st, err)
	}
}

// TestStateCacheTrust: while the root is unchanged, a parsed state file
// with a gofer pid is used without a stat for trustFor (a change in place
// unseen), then statted again; one without a gofer pid (a subcontainer
// before `runsc start`) is statted every time; a file created in the root
// ends the trust at once.
func TestStateCacheTrust(t *testing.T) {
	root, busy, old, age := agedRunscRoot(t)
	c := newStateCache()
	find := func() []runscState {
		t.Helper()
		sb, _, err := c.findSandbox([]string{root}, "", 21385, "")
		if err != nil {
			t.Fatal(err)
		}
		return sb.Containers
	}
	rewrite := func(from, to string) {
		t.Helper()
		b, _ := os.ReadFile(busy)
		os.WriteFile(busy, bytes.Replace(b, []byte(from), []byte(to), 1), 0o640)
		age(busy, old.Add(time.Second))
	}
	expire := func() {
		c.mu.Lock()
		for p, f := range c.files {
			f.checked = time.Now().Add(-stateTrustFor)
			c.files[p] = f
		}
		c.mu.Unlock()
	}
	find()
	rewrite(`"busy"`, `"BUSY"`)
	if got := find(); got[1].Name != "busy" {
		t.Errorf("within trustFor: %q, want the trusted busy", got[1].Name)
	}
	expire()
	if got := find(); got[1].Name != "BUSY" {
		t.Errorf("after trustFor: %q, want BUSY read again", got[1].Name)
	}

	// No gofer pid: statted every time.
	rewrite(`"goferPid":21436`, `"goferPid":0`)
	expire()
	if got := find(); got[1].GoferPID != 0 {
		t.Fatalf("gofer pid %d, want 0", got[1].GoferPID)
	}
	rewrite(`"goferPid":0`, `"goferPid":21436`) // runsc start
	if got := find(); got[1].GoferPID != 21436 {
		t.Errorf("gofer pid %d after the rewrite, want 21436 at once", got[1].GoferPID)
	}

	// A file created in the root: every file statted again.
	rewrite(`"BUSY"`, `"busy"`)
	os.WriteFile(filepath.Join(root, "other.tmp"), nil, 0o600)
	if got := find(); got[1].Name != "busy" {
		t.Errorf("root changed: %q, want busy read again", got[1].Name)
	}
}

// agedRunscRoot is getRunscRoot with the root and its files an hour old
// (outside the racy window), the busy container's state file, that hour,
// and a function setting a file's mtime.
func agedRunscRoot(t *testing.T) (root, busy string, old time.Time, age func(string, time.Time)) {
	t.Helper()
	root = getRunscRoot(t, nil)
	old = time.Now().Add(-time.Hour)
	age = func(p string, at time.Time) {
		t.Helper()
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	busy = filepath.Join(root, "gvx-busy_sandbox:gvx-sbx.state")
	for n := range stateFixtures {
		age(filepath.Join(root, n), old)
	}
	age(root, old)
	return root, busy, old, age
}

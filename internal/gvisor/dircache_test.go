package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestCgroupRemadeIsReadAfresh: the reader keeps the cgroup directory open
// between samples; when the cgroup is removed and made again under the same
// path, the new one is read, and while it is missing the sample says so.
func TestCgroupRemadeIsReadAfresh(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"}, Config{CgroupRoot: cg, Mode: ModeUnified})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if r, err := s.Sample(ctx); err != nil || r.MemoryCurrentBytes != 268435456 {
		t.Fatalf("first sample = %d, %v", r.MemoryCurrentBytes, err)
	}
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx); !errors.Is(err, errCgroupGone) || !errors.Is(err, source.ErrNotMeasurable) || !errors.Is(err, source.ErrSandboxGone) {
		t.Fatalf("removed cgroup: err = %v, want ErrNotMeasurable and ErrSandboxGone (no such cgroup)", err)
	}
	if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2-dead/sandbox")); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Sample(ctx); err != nil || r.MemoryCurrentBytes != 12288 {
		t.Fatalf("remade cgroup: sample = %d, %v; want the new cgroup's 12288", r.MemoryCurrentBytes, err)
	}
}

// TestDirStatPerHandle: two handles on the same cgroup path, one on a
// removed directory and one on the directory made again. dirState must say
// "same" for the fresh handle only, and "gone" once the path is removed.
func TestDirStatPerHandle(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	src, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, ReadTimeout: 10 * time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := src.(*cgroupSource)
	open := func() *dirHandle {
		f, err := s.unified.Open("sandbox")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return &dirHandle{f: f}
	}
	stale := open()
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
		t.Fatal(err)
	}
	fresh := open()

	type result struct{ Exists, Same bool }
	state := func(h *dirHandle) result {
		e, same, err := dirState(s.unified, "/sandbox", h)
		if err != nil {
			t.Fatal(err)
		}
		return result{e, same}
	}
	got := map[string]result{"fresh": state(fresh), "stale": state(stale), "none": state(nil)}
	if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
		t.Fatal(err)
	}
	got["removed"] = state(fresh)
	want := map[string]result{"fresh": {true, true}, "stale": {true, false}, "none": {true, false}, "removed": {false, false}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dirState (-want +got):\n%s", diff)
	}
}

// TestDirOpenedAfterCloseIsNotCached: a cgroup directory whose open finishes
// after Close is closed, not stored in the cache (where nothing would ever
// close it).
func TestDirOpenedAfterCloseIsNotCached(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	src, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, ReadTimeout: 10 * time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	s := src.(*cgroupSource)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHook = func(op string) {
		if op != "open" {
			return
		}
		once.Do(func() { close(entered) })
		<-release
	}
	defer func() { testHook = nil }()
	done := make(chan error, 1)
	go func() { _, err := s.Sample(context.Background()); done <- err }()
	<-entered // the directory is open, not yet cached
	s.Close()
	close(release)
	if err := <-done; err == nil {
		t.Errorf("Sample racing Close succeeded; want an error")
	}
	s.mu.Lock()
	n := len(s.dirs)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d directories cached after Close, want 0 (a leaked handle)", n)
	}
}

// TestRecreatedCgroupDoesNotPinHandles: each time the cgroup is removed and
// made again, the handle on the removed directory is closed once no read
// uses it, not kept (pinning a dying memcg) until Close.
func TestRecreatedCgroupDoesNotPinHandles(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	cg := copyTree(t, "testdata/cgroup/v2")
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	if _, err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	before := fds()
	const n = 20
	for i := range n {
		if err := os.RemoveAll(filepath.Join(cg, "sandbox")); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(filepath.Join(cg, "sandbox"), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sample(ctx); err != nil {
			t.Fatalf("sample after recreation %d: %v", i, err)
		}
	}
	if after := fds(); after > before+2 {
		t.Errorf("open fds: %d before, %d after %d recreations of the cgroup; want no growth", before, after, n)
	}
}

// TestMissingUnifiedCgroupLookedUpAgain: a sandbox bound by path on a
// hybrid host whose unified hierarchy lacks its cgroup (the launcher made
// the v1 ones alone) has its pressure absent; the missing directory is not
// opened again at the next sample, and once it is made its pressure is
// read from the first sample after missingRecheck.
func TestMissingUnifiedCgroupLookedUpAgain(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/hybrid-signals")
	unified := filepath.Join(cg, "unified", "statstest")
	if err := os.Rename(unified, unified+".away"); err != nil {
		t.Fatal(err)
	}
	src, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest/pause"},
		Config{CgroupRoot: cg, Mode: ModeHybrid, ReadTimeout: 10 * time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := src.(*cgroupSource)
	var mu sync.Mutex
	opens := 0
	testHook = func(string) { mu.Lock(); opens++; mu.Unlock() }
	t.Cleanup(func() { testHook = nil })
	sample := func() (source.Reading, int) {
		t.Helper()
		mu.Lock()
		opens = 0
		mu.Unlock()
		r, err := s.Sample(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return r, opens
	}
	pressureWhy := func(r source.Reading) string {
		for _, a := range r.Absent {
			if a.Field == "pressure" {
				return a.Reason
			}
		}
		return ""
	}
	wantWhy := "no cgroup " + filepath.Join(cg, "unified", "statstest/pause")
	r, n := sample()
	if r.Pressure != nil || pressureWhy(r) != wantWhy || n == 0 {
		t.Fatalf("first sample: pressure %v, absent %q, %d opens; want absent %q after opening the directories", r.Pressure, pressureWhy(r), n, wantWhy)
	}
	r, n = sample()
	if r.Pressure != nil || pressureWhy(r) != wantWhy || n != 0 {
		t.Fatalf("second sample: pressure %v, absent %q, %d opens; want the same absence and no open", r.Pressure, pressureWhy(r), n)
	}
	if err := os.Rename(unified+".away", unified); err != nil {
		t.Fatal(err)
	}
	if r, _ = sample(); r.Pressure != nil {
		t.Fatalf("within %v of the look: pressure %v, want still absent", missingRecheck, r.Pressure)
	}
	s.mu.Lock()
	for id := range s.missing {
		s.missing[id] = time.Now().Add(-missingRecheck)
	}
	s.mu.Unlock()
	if r, n = sample(); r.Pressure == nil || n != 1 || pressureWhy(r) != "" {
		t.Fatalf("after %v: pressure %v (absent %q), %d opens; want it read, the directory opened once", missingRecheck, r.Pressure, pressureWhy(r), n)
	}
	s.mu.Lock()
	left := len(s.missing)
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d directories still known missing, want none", left)
	}
}

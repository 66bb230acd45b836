//go:build unix

package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestHungMemoryCurrent puts a FIFO with no writer in place of
// memory.current: opening it never returns. Sample must give ErrTimeout
// within the bound, and 100 concurrent Samples must share the one hung read.
func TestHungMemoryCurrent(t *testing.T) {
	cg := copyTree(t, "testdata/cgroup/v2")
	fifo := filepath.Join(cg, "sandbox", "memory.current")
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // unblock the hung open so nothing leaks
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	const bound = 200 * time.Millisecond
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"},
		Config{CgroupRoot: cg, Mode: ModeUnified, ReadTimeout: bound, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	start := time.Now()
	if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrTimeout) {
		t.Fatalf("Sample() = %v, want ErrTimeout", err)
	}
	first := time.Since(start)
	// The upper bound is generous: a loaded 2-core runner can be late by
	// far more than the read bound itself; "hung forever" is what it catches.
	if first < bound || first > bound+3*time.Second {
		t.Errorf("Sample took %v, want about %v", first, bound)
	}

	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	var peak int
	var mu sync.Mutex
	start = time.Now()
	for range 100 {
		wg.Go(func() {
			_, err := s.Sample(context.Background())
			errs <- err
			mu.Lock()
			peak = max(peak, runtime.NumGoroutine())
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, source.ErrTimeout) {
			t.Fatalf("concurrent Sample() = %v, want ErrTimeout", err)
		}
	}
	all := time.Since(start)
	if all > bound+3*time.Second {
		t.Errorf("100 concurrent Samples took %v, want about %v", all, bound)
	}
	// The callers themselves are gone; what remains is at most the one hung
	// read (plus scheduling slack). Goroutines that have returned may take a
	// moment to exit, so poll before failing.
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); after > before+2 && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if after > before+2 {
		t.Errorf("goroutines: %d before, %d after 100 concurrent Samples against a hung read", before, after)
	}
	if n := s.(*cgroupSource).g.InFlight(); n != 1 {
		t.Errorf("reads in flight = %d, want the 1 hung read shared by every caller", n)
	}
	t.Logf("one Sample timed out after %v; 100 concurrent Samples after %v; goroutines: %d before, peak %d during (100 callers), %d after",
		first.Round(time.Millisecond), all.Round(time.Millisecond), before, peak, runtime.NumGoroutine())
}

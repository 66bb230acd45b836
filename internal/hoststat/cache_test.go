package hoststat

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestHostViewCache: readers cannot set the rate of host samples (each may
// unshare a mount namespace and mount debugfs: 2,318 a second were
// measured): 1000 StatsHost-like calls in quick succession, 8 at a time,
// make at most a handful of samples; every answer is a whole sample.
func TestHostViewCache(t *testing.T) {
	root := t.TempDir()
	writeThread(t, root, 300, 300, "runsc-sandbox")
	var samples atomic.Int32
	h, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: 300}, Config{ProcRoot: root, DebugfsRoot: t.TempDir(),
		DisableDebugfsMount: true, SandboxProcesses: func(string, int32) ([]int32, error) {
			samples.Add(1)
			return []int32{300}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 125 {
				hs, err := h.SampleHost(context.Background())
				if err != nil || hs.VMMThreads == nil || len(hs.VMMThreads.Threads) != 1 {
					t.Errorf("SampleHost = %v, %v", hs, err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	allowed := int32(took/DefaultMinInterval) + 2
	t.Logf("measured: 1000 calls in %v made %d host samples", took.Round(time.Millisecond), samples.Load())
	if n := samples.Load(); n > allowed {
		t.Errorf("1000 calls in %v made %d host samples, want at most %d (one per %v)", took, n, allowed, DefaultMinInterval)
	}
}

// TestHostViewCacheExpires: after the interval a call samples again; a
// negative interval turns the cache off.
func TestHostViewCacheExpires(t *testing.T) {
	root := t.TempDir()
	writeThread(t, root, 300, 300, "runsc-sandbox")
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     int32
	}{{"50ms cache", 50 * time.Millisecond, 2}, {"off", -1, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			var samples atomic.Int32
			h, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: 300}, Config{ProcRoot: root, DebugfsRoot: t.TempDir(),
				DisableDebugfsMount: true, MinInterval: tc.interval, SandboxProcesses: func(string, int32) ([]int32, error) {
					samples.Add(1)
					return []int32{300}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			h.SampleHost(context.Background())
			h.SampleHost(context.Background())
			time.Sleep(60 * time.Millisecond)
			h.SampleHost(context.Background())
			if n := samples.Load(); n != tc.want {
				t.Errorf("%d samples, want %d", n, tc.want)
			}
		})
	}
}

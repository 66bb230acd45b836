package main

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestReleaser: the memory is given back once per quiet period, only after a
// collection, never while RPCs keep coming, and an idle statsd is left with
// no timer armed.
func TestReleaser(t *testing.T) {
	const after = 200 * time.Millisecond
	type result struct {
		Releases int
		Armed    bool
	}
	for _, tc := range []struct {
		name string
		off  bool
		// collect makes a collection happen before the quiet period.
		collect bool
		// busy keeps RPCs coming for this long before the quiet period.
		busy time.Duration
		// wait is how long the test waits before looking (then it looks
		// again after 3 more quiet periods: no second release).
		wait time.Duration
		want result
	}{
		{name: "idle from the start: no collection, no release", wait: 3 * after, want: result{Releases: 0, Armed: false}},
		{name: "after a burst: one release", collect: true, wait: 3 * after, want: result{Releases: 1, Armed: false}},
		{name: "RPCs keep coming: none yet", collect: true, busy: 5 * after, wait: 0, want: result{Releases: 0, Armed: true}},
		{name: "RPCs stopped: one release", collect: true, busy: 5 * after, wait: 3 * after, want: result{Releases: 1, Armed: false}},
		{name: "turned off", off: true, collect: true, wait: 3 * after, want: result{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var releases atomic.Int32
			var cycles atomic.Uint64
			d := after
			if tc.off {
				d = 0
			}
			r := newReleaser(d, func() { releases.Add(1); cycles.Add(2) }, cycles.Load)
			defer r.stop()
			if tc.collect {
				cycles.Add(1)
			}
			for end := time.Now().Add(tc.busy); time.Now().Before(end); time.Sleep(after / 10) {
				r.touch()
			}
			if tc.busy > 0 {
				r.touch() // an RPC just ended
			}
			look := func() result {
				r.mu.Lock()
				defer r.mu.Unlock()
				return result{Releases: int(releases.Load()), Armed: r.armed}
			}
			time.Sleep(tc.wait)
			if diff := cmp.Diff(tc.want, look()); diff != "" {
				t.Errorf("after %v of quiet (-want +got):\n%s", tc.wait, diff)
			}
			if tc.wait == 0 {
				return
			}
			time.Sleep(3 * after)
			if diff := cmp.Diff(tc.want, look()); diff != "" {
				t.Errorf("3 quiet periods later (-want +got):\n%s", diff)
			}
		})
	}
}

package main

// This file gives memory back after a burst: once no RPC has arrived for
// --release-after, statsd returns the free heap to the system, once.

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// releaser calls release once no RPC has started or ended for after, if
// the heap has been collected since the last release (or the start): a
// burst that made the heap reach its goal left pages to give back, while a
// collection forced on a heap that never grew would only cost memory (its
// first mark touches the collector's own metadata, about 0.4 MiB, more
// than a quiet statsd's garbage). It holds one timer, armed by the first
// RPC after it fired (or at start) and not re-armed after firing: a statsd
// idle for good has no timer running and wakes for nothing.
type releaser struct {
	after   time.Duration
	release func()
	cycles  func() uint64 // collections so far

	mu      sync.Mutex
	timer   *time.Timer // nil when after <= 0
	armed   bool
	stopped bool
	last    time.Time // the last RPC's start or end
	seen    uint64    // cycles() after the last release (or at start)
}

// newReleaser returns a releaser that calls release (freeMemory when nil)
// once no RPC has come for after, counting from now, if cycles
// (the runtime's count of collections when nil) has grown since; after <= 0
// turns it off. Stop it when done.
func newReleaser(after time.Duration, release func(), cycles func() uint64) *releaser {
	if release == nil {
		release = freeMemory
	}
	if cycles == nil {
		cycles = gcCycles()
	}
	r := &releaser{after: after, release: release, cycles: cycles}
	if after > 0 {
		r.mu.Lock()
		r.last, r.armed, r.seen = time.Now(), true, cycles()
		r.timer = time.AfterFunc(after, r.fire)
		r.mu.Unlock()
	}
	return r
}

// touch records activity and arms the timer if it is not running.
func (r *releaser) touch() {
	if r.timer == nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	r.last = now
	if !r.armed && !r.stopped {
		r.armed = true
		r.timer.Reset(r.after)
	}
	r.mu.Unlock()
}

// fire runs on the timer: it waits out the rest of the quiet period when
// an RPC came meanwhile, else releases and leaves the timer unarmed.
func (r *releaser) fire() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	if quiet := time.Since(r.last); quiet < r.after {
		r.timer.Reset(r.after - quiet)
		r.mu.Unlock()
		return
	}
	r.armed = false
	if r.cycles() == r.seen {
		r.mu.Unlock()
		return // no collection since the last release: nothing worth it
	}
	r.mu.Unlock()
	r.release()
	r.mu.Lock()
	r.seen = r.cycles()
	r.mu.Unlock()
}

// freeMemory returns the free heap to the system after two collections:
// the first leaves what the sync.Pools held (gRPC's buffers among them) to
// the second.
func freeMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// gcCycles returns a function that reports how many collections have
// completed (called under the releaser's lock). It asks runtime/debug,
// reusing one GCStats (10 KiB of buffers, allocated at the first call),
// rather than runtime/metrics, whose init and first Read left 34 KiB on an
// idle statsd's heap (runtime.ReadMemStats, which stops the world, added
// 0.45 MiB of anonymous memory in TestIntegrationStatsdMemory).
func gcCycles() func() uint64 {
	var st debug.GCStats
	return func() uint64 {
		debug.ReadGCStats(&st)
		return uint64(st.NumGC)
	}
}

// stop stops the timer (a release already running finishes).
func (r *releaser) stop() {
	if r.timer == nil {
		return
	}
	r.mu.Lock()
	r.stopped = true
	r.timer.Stop()
	r.mu.Unlock()
}

// options are the interceptors that count every RPC, unary or streaming,
// as activity at its start and its end.
func (r *releaser) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			r.touch()
			defer r.touch()
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			r.touch()
			defer r.touch()
			return handler(srv, ss)
		}),
	}
}

// Package bounded runs blocking reads (kernel files, pid files, agent calls)
// under a deadline, with at most one call in flight per key, shared by every
// caller that asks for that key meanwhile.
//
// A read that never returns (a FIFO with no writer, a hung agent) then costs
// its callers only the deadline and costs the process one goroutine per key,
// however many polls arrive: the next caller joins the hung call instead of
// starting another. Every file-reading source uses it.
package bounded

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Group shares in-flight calls by key. The zero value is not usable: make one
// with New.
type Group struct {
	timeout time.Duration

	mu    sync.Mutex
	calls map[string]*call
}

type call struct {
	done    chan struct{}
	val     any
	err     error
	batch   *Batch      // DoBatch's: names the file in progress at a deadline
	running atomic.Bool // its worker has begun it (Start's yield)
}

// New returns a Group whose calls each get at most timeout (0 means only the
// caller's context bounds them).
func New(timeout time.Duration) *Group {
	return &Group{timeout: timeout, calls: make(map[string]*call)}
}

// Do runs fn for key unless a call for key is already in flight, in which case
// it waits for that one. It returns when the call finishes or when ctx (capped
// by the Group's timeout) is done, whichever is first; on the deadline the
// error wraps source.ErrTimeout and the call goes on alone, still shared, until
// it returns. fn gets no context: it is the blocking part.
func Do[T any](ctx context.Context, g *Group, key string, fn func() (T, error)) (T, error) {
	return do[T](ctx, g, key, func(*call) func() (any, error) {
		return func() (any, error) { return fn() }
	})
}

// Start is Do without the wait: the call for key starts (or is joined)
// now, and the Pending's Wait, called once, returns its result as Do would
// have, bounded by ctx capped by the Group's timeout from now. A caller does
// other work between the two (the call runs meanwhile on a worker) without a
// goroutine of its own to wait in; a caller that no longer wants the result
// calls Abandon instead of Wait (the call goes on, shared, as after a
// deadline).
//
// A call Start begins runs before Start returns, up to its first wait (a
// request written, its reply awaited): Start yields its processor to the
// call's worker. With one Go processor (statsd's: internal/oneproc) the
// worker would otherwise run only once the caller blocks, after the
// caller's own work, and then wait for its peer alone; so the peer works
// while the caller does. The caller waits behind the goroutines already
// runnable, and a call that blocks in a system call instead (a hung file)
// holds the processor until the runtime's monitor takes it back, as from
// any goroutine blocked so: at its second look, about 20 ms at most
// (TestStartYields).
func Start[T any](ctx context.Context, g *Group, key string, fn func() (T, error)) Pending[T] {
	ctx, cancel := g.bound(ctx)
	c, started := g.join(key, func(*call) func() (any, error) {
		return func() (any, error) { return fn() }
	})
	// A yield can come back to the caller first: the scheduler takes
	// the global run queue, where Gosched puts the caller, before the
	// worker at every 61st turn. The second then runs the worker.
	for i := 0; started && i < 2 && !c.running.Load(); i++ {
		runtime.Gosched()
	}
	return Pending[T]{ctx: ctx, cancel: cancel, key: key, c: c}
}

// Pending is a call started by Start. Exactly one of Wait and Abandon is
// called, once; the zero Pending is none (Started reports false).
type Pending[T any] struct {
	ctx    context.Context
	cancel context.CancelFunc
	key    string
	c      *call
}

// Started reports whether p is a started call.
func (p Pending[T]) Started() bool { return p.c != nil }

// Wait returns the call's result as Do would have.
func (p Pending[T]) Wait() (T, error) {
	defer p.cancel()
	return await[T](p.ctx, p.key, p.c)
}

// Abandon gives the result up without waiting for it.
func (p Pending[T]) Abandon() { p.cancel() }

// do is Do and DoBatch: start makes the function of a new call (given the
// call, to keep what a caller at its deadline may ask about it).
func do[T any](ctx context.Context, g *Group, key string, start func(*call) func() (any, error)) (T, error) {
	ctx, cancel := g.bound(ctx)
	defer cancel()
	c, _ := g.join(key, start)
	return await[T](ctx, key, c)
}

// bound caps ctx by the Group's timeout. A caller's deadline within it
// already bounds the wait: no context (and timer) of its own then.
func (g *Group) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.timeout > 0 {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > g.timeout {
			return context.WithTimeout(ctx, g.timeout)
		}
	}
	return ctx, func() {}
}

// join returns the call in flight for key, or starts one made by start
// (started true).
func (g *Group) join(key string, start func(*call) func() (any, error)) (c *call, started bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.calls[key]
	if !ok {
		c = &call{done: make(chan struct{})}
		g.calls[key] = c
		fn := start(c)
		spawn(func() { g.run(key, c, fn) })
	}
	return c, !ok
}

// await waits for c until ctx is done.
func await[T any](ctx context.Context, key string, c *call) (T, error) {
	var zero T
	select {
	case <-c.done:
		if c.err != nil {
			return zero, c.err
		}
		v, _ := c.val.(T) // a nil interface value asserts to the zero T
		return v, nil
	case <-ctx.Done():
		what := strings.ReplaceAll(key, "\x00", "/")
		if c.batch != nil {
			if f := c.batch.current(); f != "" {
				what = f
			}
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			// The caller went away; that is not the read's fault.
			return zero, fmt.Errorf("%s: %w", what, ctx.Err())
		}
		return zero, fmt.Errorf("%w: %s: %w", source.ErrTimeout, what, ctx.Err())
	}
}

func (g *Group) run(key string, c *call, fn func() (any, error)) {
	defer func() {
		// This goroutine is outside every RPC's panic recovery: a panicking
		// read must not take the daemon down.
		if p := recover(); p != nil {
			c.val, c.err = nil, fmt.Errorf("%w: read of %s panicked: %v", source.ErrMalformed, strings.ReplaceAll(key, "\x00", "/"), p)
		}
		g.mu.Lock()
		delete(g.calls, key)
		g.mu.Unlock()
		close(c.done)
	}()
	c.running.Store(true)
	c.val, c.err = fn()
}

// InFlight reports how many calls are running now (hung ones included).
func (g *Group) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.calls)
}

// ReadFile reads a whole file of at most MaxFileBytes under the Group's
// bound. Errors name the path; os.ErrNotExist stays detectable with
// errors.Is.
func (g *Group) ReadFile(ctx context.Context, path string) ([]byte, error) {
	return Do(ctx, g, path, func() ([]byte, error) { return ReadFile(path, MaxFileBytes) })
}

// ReadRegularFile reads a small regular file (a pid file, a state file) under
// the Group's bound, as the package-level ReadRegularFile does.
func (g *Group) ReadRegularFile(ctx context.Context, path string, max int) ([]byte, error) {
	return Do(ctx, g, "regular\x00"+path, func() ([]byte, error) { return ReadRegularFile(path, max) })
}

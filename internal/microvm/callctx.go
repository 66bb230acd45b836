package microvm

// This file is the context of an agent call: CallTimeout's deadline, which
// ttrpc sends to the agent and waits on. context.WithTimeout made a
// context, a timer and a channel for every call; a callContext is reused
// from call to call, its timer reset, as long as no deadline has fired.

import (
	"context"
	"sync"
	"time"
)

// callContext is a context with only a deadline: no values, no parent,
// Done closed by its timer at the deadline. One call holds it from
// startCall to end. Never derive a context from it (context.WithCancel and
// the like would keep a reference past end, when it is reused).
type callContext struct {
	deadline time.Time
	done     chan struct{}
	timer    *time.Timer
}

var _ context.Context = (*callContext)(nil)

func (c *callContext) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *callContext) Done() <-chan struct{}       { return c.done }
func (c *callContext) Value(any) any               { return nil }

func (c *callContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// callContexts are the callContexts whose timer was stopped before it
// fired: their done is open, to be reused.
var callContexts sync.Pool

// startCall returns a context done timeout from now.
func startCall(timeout time.Duration) *callContext {
	c, _ := callContexts.Get().(*callContext)
	if c == nil {
		c = &callContext{done: make(chan struct{})}
		c.timer = time.AfterFunc(timeout, func() { close(c.done) })
	} else {
		c.timer.Reset(timeout)
	}
	c.deadline = time.Now().Add(timeout)
	return c
}

// end ends the call: c is kept for another unless its deadline fired
// (its done is closed for good).
func (c *callContext) end() {
	if c.timer.Stop() {
		callContexts.Put(c)
	}
}

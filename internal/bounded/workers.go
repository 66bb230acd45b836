package bounded

// This file runs the calls of every Group on a few kept goroutines: a call
// on a new goroutine pays for growing its stack (the runtime copies it a few
// times while a gRPC or ttrpc call and a decode run deep), one that a
// previous call left grown does not.

import "sync/atomic"

// maxIdleWorkers is how many goroutines wait for the next call once theirs
// returned. They block on a channel: an idle statsd wakes none of them.
const maxIdleWorkers = 4

var (
	work        = make(chan func()) // taken by an idle worker
	idleWorkers atomic.Int32
)

// spawn runs f on an idle worker, or on a new one when none is idle (a call
// that never returns keeps its worker: hung calls never delay others).
func spawn(f func()) {
	select {
	case work <- f:
	default:
		go worker(f)
	}
}

func worker(f func()) {
	for {
		f()
		if idleWorkers.Add(1) > maxIdleWorkers {
			idleWorkers.Add(-1)
			return
		}
		f = <-work
		idleWorkers.Add(-1)
	}
}

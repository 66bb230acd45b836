package process

import (
	"errors"
	"fmt"
	"sync"
)

// ErrReused marks a pid that now names another process than the one pinned
// behind it: another start time, or another executable.
var ErrReused = errors.New("process: the pid now names another process")

// Tracker pins the process behind a pid the first time it is asked about
// that pid, and afterwards tells whether the pid still names it: a VMM pid
// given once (a ref's vmm_pid, a pid file left behind by a killed VMM) must
// never be read as the VMM once another process has the pid. Safe for
// concurrent use.
type Tracker struct {
	procRoot string

	mu     sync.Mutex
	pin    Pin
	pinned bool
}

// NewTracker tracks processes under procRoot.
func NewTracker(procRoot string) *Tracker { return &Tracker{procRoot: procRoot} }

// Check returns the pin of pid. The first call, and a call for another pid
// than the pinned one (a pid file rewritten by a restarted VMM names the
// process it is told to), pins the process running as pid now. A later call
// for the pinned pid fails with an error wrapping ErrReused when the pid
// now names another process (the pin is kept: the newcomer is never
// pinned), and with an error for which IsGone is true when it is gone.
func (t *Tracker) Check(pid int) (Pin, error) {
	now, err := pinOf(t.procRoot, pid)
	if err != nil {
		return Pin{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.pinned || t.pin.PID != pid {
		t.pin, t.pinned = now, true
		return now, nil
	}
	was := t.pin
	switch {
	case now.StartTicks != was.StartTicks:
		return Pin{}, fmt.Errorf("%w: pid %d started at tick %d, the pinned process at %d", ErrReused, pid, now.StartTicks, was.StartTicks)
	case now.Exe != "" && was.Exe != "" && now.Exe != was.Exe:
		return Pin{}, fmt.Errorf("%w: pid %d runs %q, the pinned process ran %q", ErrReused, pid, now.Exe, was.Exe)
	case was.Exe == "" && now.Exe != "":
		t.pin.Exe = now.Exe // learnt late (the first read was refused)
	}
	return t.pin, nil
}

// Pinned returns the pin, if a process is pinned.
func (t *Tracker) Pinned() (Pin, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pin, t.pinned
}

// Reset forgets the pin (a new epoch: the launcher names the VMM anew).
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pin, t.pinned = Pin{}, false
}

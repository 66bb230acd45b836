// This file is the breakdown's persisted state (source.Persistent): the
// split's and the own tracker's figures a restarted statsd continues from,
// so that the split goes on by increments instead of splitting the pod's
// whole history again among the containers listed now.

package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// ErrBreakdownState marks a persisted breakdown state that is refused.
var ErrBreakdownState = errors.New("gvisor: breakdown state")

// Caps of a persisted breakdown state (its bytes: source.MaxBreakdownStateBytes).
const (
	breakdownStateVersion = 1
	// maxStateContainers: the containers kept (those listed at the last
	// sample first); one not kept starts again from 0 after a restart.
	maxStateContainers = 64
	// maxStateProcs: the checked sentry and gofers kept.
	maxStateProcs = 32
)

// breakdownState is the persisted state, as JSON.
type breakdownState struct {
	Version   int    `json:"v"`
	SandboxID string `json:"sandbox_id"`
	Pause     string `json:"pause,omitempty"` // the pause container's id
	// OwnShare is the last sandbox_own_cpu_usec served (the floor of the
	// next).
	OwnShare uint64 `json:"own_share_usec,omitempty"`
	// The splitter's: the processes' own usec (highest seen), the part
	// already split, each container's raw figure (ns) and attributed usec.
	Own        uint64           `json:"own_usec"`
	Split      uint64           `json:"split_usec"`
	Containers []containerState `json:"containers,omitempty"`
	// The own tracker's: the CPU of the processes gone, the checked ones
	// (pid, start time, CPU), the sentry's platform. The CPU is written in
	// USER_HZ ticks (up to a tick below a process's figure). µs beside
	// them (DoneUsec, procState.Usec; the ticks their truncation) are read
	// when present but not written yet: a statsd before this one refuses
	// unknown fields, so writing them would make a rollback to it drop
	// every gVisor binding's state (the split started afresh). The release
	// after this one writes them (writeOwnUsec).
	DoneTicks   uint64      `json:"done_ticks,omitempty"`
	DoneUsec    uint64      `json:"done_usec,omitempty"`
	Procs       []procState `json:"procs,omitempty"`
	SentryStart uint64      `json:"sentry_start,omitempty"`
	KVM         bool        `json:"kvm,omitempty"`
}

type containerState struct {
	ID   string `json:"id"`
	Raw  uint64 `json:"raw_ns"`
	Attr uint64 `json:"attr_usec"`
}

type procState struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	Ticks uint64 `json:"ticks"`
	Usec  uint64 `json:"usec,omitempty"` // absent (0) in an older statsd's state
}

// writeOwnUsec says whether exportState writes the own CPU in µs beside
// the ticks: false until every statsd a rollback may go back to reads them
// (this one is the first that does).
const writeOwnUsec = false

// usecOf is a persisted CPU figure in µs: usec when given (validate: its
// ticks are usec's, truncated), else ticks.
func usecOf(ticks, usec uint64) uint64 { return max(usec, ticks*tickUsec) }

// validate checks a decoded state against the caps and itself.
func (st *breakdownState) validate() error {
	switch {
	case st.Version != breakdownStateVersion:
		return fmt.Errorf("%w: version %d", ErrBreakdownState, st.Version)
	case st.SandboxID == "" || len(st.SandboxID) > maxContainerText || len(st.Pause) > maxContainerText:
		return fmt.Errorf("%w: sandbox id of %d bytes, pause id of %d", ErrBreakdownState, len(st.SandboxID), len(st.Pause))
	case len(st.Containers) > maxStateContainers || len(st.Procs) > maxStateProcs:
		return fmt.Errorf("%w: %d containers (at most %d), %d processes (at most %d)", ErrBreakdownState, len(st.Containers), maxStateContainers, len(st.Procs), maxStateProcs)
	}
	seen := map[string]bool{}
	var sum uint64
	for i, c := range st.Containers {
		if c.ID == "" || len(c.ID) > maxContainerText || seen[c.ID] {
			return fmt.Errorf("%w: container %d: empty, long or repeated id", ErrBreakdownState, i)
		}
		seen[c.ID] = true
		if sum+c.Attr < sum {
			return fmt.Errorf("%w: attributed figures overflow", ErrBreakdownState)
		}
		sum += c.Attr
	}
	if sum > st.Split {
		return fmt.Errorf("%w: containers hold %d usec, more than the %d split", ErrBreakdownState, sum, st.Split)
	}
	if st.DoneUsec != 0 && st.DoneUsec/tickUsec != st.DoneTicks {
		return fmt.Errorf("%w: done_usec %d is not done_ticks %d", ErrBreakdownState, st.DoneUsec, st.DoneTicks)
	}
	pids := map[int]bool{}
	for i, p := range st.Procs {
		if p.PID <= 0 || pids[p.PID] {
			return fmt.Errorf("%w: process %d: pid %d", ErrBreakdownState, i, p.PID)
		}
		if p.Usec != 0 && p.Usec/tickUsec != p.Ticks {
			return fmt.Errorf("%w: process %d: usec %d is not its ticks %d", ErrBreakdownState, i, p.Usec, p.Ticks)
		}
		pids[p.PID] = true
	}
	return nil
}

// decodeBreakdownState decodes and validates a persisted state.
func decodeBreakdownState(b []byte) (breakdownState, error) {
	var st breakdownState
	if len(b) > source.MaxBreakdownStateBytes {
		return st, fmt.Errorf("%w: %d bytes, over %d", ErrBreakdownState, len(b), source.MaxBreakdownStateBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return st, fmt.Errorf("%w: %w", ErrBreakdownState, err)
	}
	return st, st.validate()
}

// exportState fills the splitter's part of st: the containers listed at the
// last sample first (by id), then the others, at most maxStateContainers.
// ok is false before the first sample.
func (s *splitter) exportState(st *breakdownState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prev == nil {
		return false
	}
	st.SandboxID, st.Own, st.Split = s.sid, s.own, s.split
	ids := slices.Sorted(maps.Keys(s.attr))
	slices.SortStableFunc(ids, func(a, b string) int {
		_, la := s.listed[a]
		_, lb := s.listed[b]
		switch {
		case la == lb:
			return 0
		case la:
			return -1
		}
		return 1
	})
	for _, id := range ids[:min(len(ids), maxStateContainers)] {
		st.Containers = append(st.Containers, containerState{ID: id, Raw: s.prev[id], Attr: s.attr[id]})
	}
	return true
}

// restoreState sets the splitter from a validated state.
func (s *splitter) restoreState(st breakdownState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sid, s.own, s.split, s.pending = st.SandboxID, st.Own, st.Split, 0
	s.prev, s.attr = map[string]uint64{}, map[string]uint64{}
	for _, c := range st.Containers {
		s.prev[c.ID], s.attr[c.ID] = c.Raw, c.Attr
	}
}

// exportState fills the tracker's part of st from its last read's
// snapshot (never waiting for a read in progress).
func (o *ownTracker) exportState(st *breakdownState) {
	o.snapMu.Lock()
	defer o.snapMu.Unlock()
	st.DoneTicks, st.SentryStart, st.KVM = o.snap.done/tickUsec, o.snap.sentryStart, o.snap.kvm
	st.Procs = append(st.Procs, o.snap.procs[:min(len(o.snap.procs), maxStateProcs)]...)
	if writeOwnUsec {
		st.DoneUsec = o.snap.done
		return
	}
	for i := range st.Procs {
		st.Procs[i].Usec = 0
	}
}

// restoreState sets the tracker from a validated state: the processes are
// known and checked; one gone or with another start time at the next read
// keeps its figure (done).
func (o *ownTracker) restoreState(st breakdownState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done, o.sentryStart, o.kvm = usecOf(st.DoneTicks, st.DoneUsec), st.SentryStart, st.KVM
	for _, p := range o.procs {
		if p.fd >= 0 {
			syscall.Close(p.fd)
		}
	}
	o.held = 0
	clear(o.procs)
	for _, p := range st.Procs {
		o.procs[p.PID] = ownProc{start: p.Start, ok: true, usec: usecOf(p.Ticks, p.Usec), fd: -1}
	}
	o.snapshotLocked()
}

// reset forgets a restored state that turned out to be another sandbox's.
func (o *ownTracker) reset() {
	o.restoreState(breakdownState{})
}

// snapshotLocked copies what exportState saves (under o.mu); the slice is
// reused.
func (o *ownTracker) snapshotLocked() {
	o.snapMu.Lock()
	defer o.snapMu.Unlock()
	o.snap.done, o.snap.sentryStart, o.snap.kvm = o.done, o.sentryStart, o.kvm
	o.snap.procs = o.snap.procs[:0]
	for pid, p := range o.procs {
		if p.ok {
			o.snap.procs = append(o.snap.procs, procState{PID: pid, Start: p.start, Ticks: p.usec / tickUsec, Usec: p.usec})
		}
	}
	slices.SortFunc(o.snap.procs, func(a, b procState) int { return a.PID - b.PID })
}

// BreakdownState returns the breakdown's state to persist (nil before its
// first split, or without a runsc root): source.Persistent.
func (s *cgroupSource) BreakdownState() ([]byte, error) {
	if s.bd == nil {
		return nil, nil
	}
	b := s.bd
	st := breakdownState{Version: breakdownStateVersion}
	if !b.split.exportState(&st) {
		return nil, nil
	}
	b.mu.Lock()
	st.Pause, st.OwnShare = b.pause, b.ownShare
	b.mu.Unlock()
	b.own.exportState(&st)
	out, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBreakdownState, err)
	}
	if len(out) > source.MaxBreakdownStateBytes {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrBreakdownState, len(out), source.MaxBreakdownStateBytes)
	}
	return out, nil
}

// RestoreBreakdownState continues the breakdown from a persisted state
// (before the first Sample). A state that does not decode or validate is
// refused (the breakdown starts afresh); one of another sandbox id is
// dropped at the first read that finds the sandbox.
func (s *cgroupSource) RestoreBreakdownState(b []byte) error {
	if s.bd == nil || len(b) == 0 {
		return nil
	}
	st, err := decodeBreakdownState(b)
	if err != nil {
		return err
	}
	s.bd.restore(st)
	return nil
}

// restore sets the breakdown from a validated state.
func (b *breakdown) restore(st breakdownState) {
	b.split.restoreState(st)
	b.own.restoreState(st)
	b.mu.Lock()
	b.pause, b.ownShare, b.restoredSID = st.Pause, st.OwnShare, st.SandboxID
	b.mu.Unlock()
}

var _ source.Persistent = (*cgroupSource)(nil)

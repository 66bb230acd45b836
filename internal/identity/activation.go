package identity

import (
	"encoding/json"
	"sync"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// BaselineKind says where an epoch's counters start (see the API's
// BaselineKind).
type BaselineKind int

const (
	BaselineUnspecified BaselineKind = iota
	// BaselineEpochStart: every counter of the source was 0 at the epoch
	// start (the cgroup source: a Run/Restore gets a new sandbox cgroup).
	BaselineEpochStart
	// BaselineFirstRead: the counters survive a restore (the guest agent);
	// the baseline is the epoch's first successful read.
	BaselineFirstRead
)

// Baseline is where one epoch's counters start.
type Baseline struct {
	Kind BaselineKind `json:"kind"`
	// AtUnixNano is when it holds: the epoch start, or the first read's
	// observed time.
	AtUnixNano int64 `json:"at_unix_nano"`
	// FirstRead holds the counters of that read (BaselineFirstRead only).
	FirstRead *source.Reading `json:"first_read,omitempty"`
}

// MarshalJSON writes b as its JSON fields. It exists for encoding/json's
// cache: the encoder of a type with no MarshalJSON is built with those of
// all the types it holds, so binding.json's first write would build
// source.Reading's (about 90 KiB, kept for the process's life) even in a
// statsd whose bindings never hold a first read (the gVisor class). Behind
// a MarshalJSON they are built when a baseline is written.
func (b *Baseline) MarshalJSON() ([]byte, error) {
	type plain Baseline
	return json.Marshal((*plain)(b))
}

// CPUUsec is the baseline's CPU counter: 0 at the epoch start, the first
// read's counter otherwise; ok is false when that read had none.
func (b *Baseline) CPUUsec() (usec uint64, ok bool) {
	switch {
	case b == nil:
		return 0, false
	case b.Kind == BaselineEpochStart:
		return 0, true
	case b.FirstRead == nil || b.FirstRead.CPUUsageUsec == nil:
		return 0, false
	}
	return *b.FirstRead.CPUUsageUsec, true
}

// countersSurviveRestore reports whether a ref's source keeps its counters
// across a restore: the guest agent's live in guest memory, the cgroup
// source's restart with the sandbox cgroup.
func countersSurviveRestore(ref source.SandboxRef) bool {
	return ref.Class == source.ClassMicroVM
}

// Observed is one successful reading of an activation and when it began.
type Observed struct {
	Reading    source.Reading
	AtUnixNano int64
}

// Activation is the in-memory account of one bound activation that the read
// path keeps: the last good reading (the final sample when the read at the
// end fails), the highest memory current any read saw (the peak of a source
// that offers none), the baseline, the container set and the containers
// that exited (containers.go). It never touches the disk; only the lifecycle
// (and the store's background writers) persists what the end, the baseline
// and the exited containers need. Safe for concurrent use.
type Activation struct {
	mu         sync.Mutex
	last       *Observed // as read (compose makes it a sample's)
	maxCurrent uint64
	seen       bool
	baseline   *Baseline

	set       []source.ContainerRef       // the container set now
	setIsRead bool                        // the source reads the set (a micro-VM's)
	live      map[string]source.Container // each listed container's last counters
	exited    exitedState
	// exitedChanged, when set, is told (under mu: it must not block) that
	// the exited containers changed, so the store persists them.
	exitedChanged func()
	// sampled, when set, is told (under mu: it must not block) that a
	// reading with a gVisor breakdown was observed: its source's persisted
	// state (source.Persistent) may have changed. Other readings leave it
	// be, so a statsd without breakdowns is never woken after a read.
	sampled func()
}

// newActivation starts the account of an activation of ref that began at
// epoch, with a baseline already known (restored from the state file) or nil.
func newActivation(ref source.SandboxRef, epoch int64, baseline *Baseline) *Activation {
	a := &Activation{baseline: baseline, set: ref.ContainerSet(), setIsRead: ref.Class == source.ClassMicroVM,
		live: map[string]source.Container{}}
	if a.baseline == nil && !countersSurviveRestore(ref) {
		a.baseline = &Baseline{Kind: BaselineEpochStart, AtUnixNano: epoch}
	}
	return a
}

// Observe records a successful reading observed at atUnixNano and returns
// it as a sample carries it (compose: the containers named from the set,
// the exited ones added); it updates which containers run (track). The
// first whole reading (every container read, the CPU counter there) of an
// activation whose counters survive a restore becomes its baseline: a
// partial one would leave the baseline without the counters a guest chose
// to withhold once, and the activation's CPU uncharged.
func (a *Activation) Observe(r source.Reading, atUnixNano int64) source.Reading {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.last == nil:
		a.last = &Observed{Reading: r, AtUnixNano: atUnixNano}
	case atUnixNano >= a.last.AtUnixNano:
		*a.last = Observed{Reading: r, AtUnixNano: atUnixNano} // only read under mu, by copy
	}
	// Every reading tracks, whatever its time (reads' clocks may disagree,
	// a wall clock may step back): a read that began before a container
	// left and lists it makes it live again until the next one.
	if a.track(r) && a.exitedChanged != nil {
		a.exitedChanged()
	}
	if a.sampled != nil && r.Kind == source.KindCgroup && (len(r.Containers) > 0 || r.SandboxOwnCPUUsec != nil) {
		a.sampled() // a gVisor breakdown read: its split state moved
	}
	out := a.compose(r)
	if !a.seen || r.MemoryCurrentBytes > a.maxCurrent {
		a.maxCurrent = r.MemoryCurrentBytes
	}
	a.seen = true
	if a.baseline == nil && baselineWorthy(r) {
		first := countersOnly(out)
		a.baseline = &Baseline{Kind: BaselineFirstRead, AtUnixNano: atUnixNano, FirstRead: &first}
	}
	return out
}

// Baseline returns the epoch's baseline, or nil while it is not taken.
func (a *Activation) Baseline() *Baseline {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.baseline
}

// baselineWorthy reports whether r can be an epoch's first-read baseline:
// a whole reading with the CPU counter.
func baselineWorthy(r source.Reading) bool {
	return r.CPUUsageUsec != nil && len(r.UnreadContainers) == 0
}

// snapshot returns what the end of the activation needs: the last good
// reading as a sample carries it now (the containers exited since with it).
func (a *Activation) snapshot() (last *Observed, maxCurrent uint64, seen bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last != nil {
		last = &Observed{Reading: a.compose(a.last.Reading), AtUnixNano: a.last.AtUnixNano}
	}
	return last, a.maxCurrent, a.seen
}

// countersOnly keeps the counters of r (what a baseline subtracts): CPU,
// the OOM counters, throttling, network and block IO.
func countersOnly(r source.Reading) source.Reading {
	c := source.Reading{Kind: r.Kind, CPUUsageUsec: r.CPUUsageUsec, Throttling: r.Throttling, Network: r.Network, BlockIO: r.BlockIO}
	if r.Memory != nil {
		c.Memory = &source.MemorySignals{OOMKills: r.Memory.OOMKills, OOMGroupKills: r.Memory.OOMGroupKills,
			OOMEvents: r.Memory.OOMEvents, MaxEvents: r.Memory.MaxEvents}
	}
	return c
}

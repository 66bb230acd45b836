// This file is an activation's container set and the containers that left
// it: the one place where an exited container keeps its last figures, for
// every source.

package identity

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// MaxExited bounds the exited containers one activation keeps: past it the
// oldest are folded into one entry (FoldedExitedID), whose counters are
// their sums, so the containers' sum stays. A container that exits under
// the name of an exited one (a restart: CrashLoopBackOff gives each run a
// new id) is merged into that entry first, so the cap counts distinct
// names.
const MaxExited = 25

// FoldedExitedID is the id, and the fixed name, of the entry the oldest
// exited containers are folded into past MaxExited. It is no container id
// (those have no space). How many it holds is in its gauges' absent
// reason (FoldedReason), so its name, a consumer's label, never changes.
const FoldedExitedID = "(exited, folded)"

// ReasonExited is the absent reason of an exited container's gauges.
const ReasonExited = "exited"

// FoldedReason is the absent reason of the folded entry's gauges: exited,
// and how many containers it holds.
func FoldedReason(n int) string { return fmt.Sprintf("%s; %d containers folded", ReasonExited, n) }

// FoldedCount returns how many containers a folded entry whose gauge has
// absent reason reason holds (FoldedReason); ok is false for another
// reason.
func FoldedCount(reason string) (n int, ok bool) {
	if _, err := fmt.Sscanf(reason, ReasonExited+"; %d containers folded", &n); err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// exitedState is what an activation keeps of its exited containers, and
// persists (binding.json).
type exitedState struct {
	// Containers are the exited ones, oldest first, each with its counters
	// as last read and the reasons of those absent (the gauges' "exited" is
	// added when a sample carries them).
	Containers []source.Container `json:"containers,omitempty"`
	// Folded counts the containers folded into the FoldedExitedID entry.
	Folded int `json:"folded,omitempty"`
	// Prior is, by the id of an entry a container was merged into (exit),
	// that entry's id and counters before the merge (its name is the
	// entry's): what stays exited if that container is listed again (a
	// read that began before it exited). Small: binding.json's cap holds it.
	Prior map[string]source.Container `json:"prior,omitempty"`
}

// MarshalJSON writes e as its JSON fields: encoding/json builds the
// encoders of source.Container's types when exited containers are first
// written, not at binding.json's first write (Baseline.MarshalJSON).
func (e *exitedState) MarshalJSON() ([]byte, error) {
	type plain exitedState
	return json.Marshal((*plain)(e))
}

// counterFields are a container's counters: what an exited one keeps.
var counterFields = []string{"cpu_usage_usec", "cpu_user_usec", "cpu_system_usec"}

// gaugeFields are a container's gauges: absent once it exited.
var gaugeFields = []string{"memory_current_bytes", "memory_working_set_bytes", "pids_current"}

// SetContainers makes set the activation's container set (a Run repeated
// with another set, an UpdateWorkloadContainers). Where the set is what the
// source reads (a micro-VM's), a container that leaves it exits now, with
// its figures as last read; a gVisor sandbox's set only names containers
// (runsc's state files say which run: one exits when they stop listing it).
// It reports whether the exited containers changed.
func (a *Activation) SetContainers(set []source.ContainerRef) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.set
	a.set = slices.Clone(set)
	if !a.setIsRead {
		return false
	}
	changed := false
	for _, c := range old {
		if slices.ContainsFunc(set, func(n source.ContainerRef) bool { return n.ID == c.ID }) {
			continue
		}
		if last, ok := a.live[c.ID]; ok {
			a.exit(last)
			delete(a.live, c.ID)
			changed = true
		}
	}
	return changed
}

// Containers returns the activation's container set now (a new slice).
func (a *Activation) Containers() []source.ContainerRef {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.set)
}

// exitedNow returns a copy of the exited containers' state.
func (a *Activation) exitedNow() exitedState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return exitedState{Containers: slices.Clone(a.exited.Containers), Folded: a.exited.Folded, Prior: maps.Clone(a.exited.Prior)}
}

// track updates the live containers from r, a reading, and exits
// those it no longer lists. A reading whose container list was not read
// (field "containers" absent) says nothing of who left; a container the
// reading could not read (UnreadContainers) is still there. Under a.mu.
func (a *Activation) track(r source.Reading) bool {
	if slices.ContainsFunc(r.Absent, func(x source.Absent) bool { return x.Field == "containers" }) {
		return false
	}
	listed := make(map[string]bool, len(r.Containers)+len(r.UnreadContainers))
	for _, u := range r.UnreadContainers {
		listed[u.ID] = true
	}
	changed := false
	for _, c := range r.Containers {
		listed[c.ID] = true
		if i := slices.IndexFunc(a.exited.Containers, func(e source.Container) bool { return e.ID == c.ID }); i >= 0 {
			// Listed again (a gVisor container its name was dropped from):
			// live, not exited; what it was merged into stays exited.
			a.exited.Containers = slices.Delete(slices.Clone(a.exited.Containers), i, i+1)
			if p, ok := a.exited.Prior[c.ID]; ok {
				p.Name = a.named(c).Name
				for _, f := range counterFields {
					if counterOf(p, f) == nil {
						p.Absent = append(p.Absent, source.Absent{Field: f, Reason: "not read before it exited"})
					}
				}
				a.exited.Containers = slices.Insert(a.exited.Containers, i, p)
				a.exited.Prior = maps.Clone(a.exited.Prior)
				delete(a.exited.Prior, c.ID)
			}
			changed = true
		}
		a.live[c.ID] = lastFigures(a.live[c.ID], a.named(c))
	}
	for id, last := range a.live {
		if !listed[id] {
			a.exit(last)
			delete(a.live, id)
			changed = true
		}
	}
	return changed
}

// ObserveEnd is Observe for the activation's final reading: when r could
// not list the containers (the sandbox is gone, its sentry with it), the
// containers live at the last read end with the activation, each exited
// with its figures as last read, so the final still carries them.
func (a *Activation) ObserveEnd(r source.Reading, atUnixNano int64) source.Reading {
	if slices.ContainsFunc(r.Absent, func(x source.Absent) bool { return x.Field == "containers" }) {
		a.mu.Lock()
		ids := slices.Sorted(maps.Keys(a.live))
		for _, id := range ids {
			a.exit(a.live[id])
			delete(a.live, id)
		}
		a.mu.Unlock()
	}
	return a.Observe(r, atUnixNano)
}

// named is c with its name from the set, when the set names it (a name
// from the launcher wins over the runtime's).
func (a *Activation) named(c source.Container) source.Container {
	for _, s := range a.set {
		if s.ID == c.ID && s.Name != "" {
			c.Name = s.Name
			break
		}
	}
	return c
}

// lastFigures is c's counters (each the last read one: a counter this read
// lacks keeps the one read before), with the reasons of those absent.
func lastFigures(prev, c source.Container) source.Container {
	out := source.Container{ID: c.ID, Name: c.Name, CPUUsageUsec: c.CPUUsageUsec, CPUUserUsec: c.CPUUserUsec, CPUSystemUsec: c.CPUSystemUsec}
	if out.CPUUsageUsec == nil {
		out.CPUUsageUsec = prev.CPUUsageUsec
	}
	if out.CPUUserUsec == nil {
		out.CPUUserUsec = prev.CPUUserUsec
	}
	if out.CPUSystemUsec == nil {
		out.CPUSystemUsec = prev.CPUSystemUsec
	}
	for _, f := range counterFields {
		if counterOf(out, f) != nil {
			continue
		}
		if i := slices.IndexFunc(c.Absent, func(x source.Absent) bool { return x.Field == f }); i >= 0 {
			out.Absent = append(out.Absent, source.Absent{Field: f, Reason: foreign.Bound(c.Absent[i].Reason, maxExitedReasonBytes)})
		}
	}
	return out
}

func counterOf(c source.Container, field string) *uint64 {
	switch field {
	case "cpu_usage_usec":
		return c.CPUUsageUsec
	case "cpu_user_usec":
		return c.CPUUserUsec
	default:
		return c.CPUSystemUsec
	}
}

// exit keeps last as an exited container: merged into the exited entry of
// the same non-empty name when there is one (the newest id kept, the
// counters summed, the entry moved to the newest place), else appended and
// the oldest folded past MaxExited. Under a.mu.
func (a *Activation) exit(last source.Container) {
	last.Exited = true
	list := slices.Clone(a.exited.Containers)
	if last.Name != "" {
		if i := slices.IndexFunc(list, func(e source.Container) bool { return e.ID != FoldedExitedID && e.Name == last.Name }); i >= 0 {
			m := merge(last, list[i])
			prior := maps.Clone(a.exited.Prior)
			if prior == nil {
				prior = map[string]source.Container{}
			}
			prior[last.ID] = source.Container{ID: list[i].ID, CPUUsageUsec: list[i].CPUUsageUsec,
				CPUUserUsec: list[i].CPUUserUsec, CPUSystemUsec: list[i].CPUSystemUsec, Exited: true} // its name is the entry's
			delete(prior, list[i].ID)
			a.exited.Prior = prior
			a.exited.Containers = append(slices.Delete(list, i, i+1), m)
			return
		}
	}
	a.exited.Containers = append(list, last)
	if len(a.exited.Containers) <= MaxExited {
		return
	}
	list = a.exited.Containers
	a.exited.Prior = maps.Clone(a.exited.Prior)
	delete(a.exited.Prior, list[0].ID)
	delete(a.exited.Prior, list[1].ID)
	if list[0].ID == FoldedExitedID {
		list[0] = fold(list[0], list[1])
		a.exited.Folded++
		a.exited.Containers = slices.Delete(list, 1, 2)
		return
	}
	f := fold(fold(source.Container{ID: FoldedExitedID, Name: FoldedExitedID, Exited: true}, list[0]), list[1])
	a.exited.Folded += 2
	a.exited.Containers = append([]source.Container{f}, list[2:]...)
}

// merge is newest, an exited container, with the counters of prior (an
// exited entry of the same name) added; a counter neither has keeps
// newest's absent reason.
func merge(newest, prior source.Container) source.Container {
	out := newest
	out.CPUUsageUsec = source.AddCounter(newest.CPUUsageUsec, prior.CPUUsageUsec)
	out.CPUUserUsec = source.AddCounter(newest.CPUUserUsec, prior.CPUUserUsec)
	out.CPUSystemUsec = source.AddCounter(newest.CPUSystemUsec, prior.CPUSystemUsec)
	out.Absent = slices.DeleteFunc(slices.Clone(newest.Absent), func(x source.Absent) bool { return counterOf(out, x.Field) != nil })
	return out
}

// fold adds c's counters to f's (a counter c lacks adds nothing).
func fold(f, c source.Container) source.Container {
	f.CPUUsageUsec = source.AddCounter(f.CPUUsageUsec, c.CPUUsageUsec)
	f.CPUUserUsec = source.AddCounter(f.CPUUserUsec, c.CPUUserUsec)
	f.CPUSystemUsec = source.AddCounter(f.CPUSystemUsec, c.CPUSystemUsec)
	f.Absent = nil
	for _, field := range counterFields {
		if counterOf(f, field) == nil {
			f.Absent = append(f.Absent, source.Absent{Field: field, Reason: "none of the folded containers had it"})
		}
	}
	return f
}

// compose is r as a sample carries it: its containers named from the set
// (less those exited since r was read), then the exited ones, each with its
// last counters and its gauges absent ("exited"). A guest agent's sample
// figures are its containers' sums: an exited container's CPU stays in the
// sum, so the counter never drops when one leaves; what r's sum already
// holds of it (r read before it exited: the end's last good poll) is not
// added again (notInSum). Under a.mu; r is not modified.
func (a *Activation) compose(r source.Reading) source.Reading {
	if len(a.exited.Containers) == 0 && !slices.ContainsFunc(a.set, func(c source.ContainerRef) bool { return c.Name != "" }) {
		return r
	}
	out := r
	out.Containers = make([]source.Container, 0, len(r.Containers)+len(a.exited.Containers))
	for _, c := range r.Containers {
		if !slices.ContainsFunc(a.exited.Containers, func(e source.Container) bool { return e.ID == c.ID }) {
			out.Containers = append(out.Containers, a.named(c))
		}
	}
	var exitedCPU uint64
	for _, e := range a.exited.Containers {
		reason := ReasonExited
		if e.ID == FoldedExitedID {
			e.Name, reason = FoldedExitedID, FoldedReason(a.exited.Folded)
		}
		e.Absent = slices.Clone(e.Absent)
		for _, f := range gaugeFields {
			e.Absent = append(e.Absent, source.Absent{Field: f, Reason: reason})
		}
		exitedCPU += notInSum(r, e)
		out.Containers = append(out.Containers, e)
	}
	if r.Kind == source.KindGuestAgent && r.CPUUsageUsec != nil && exitedCPU > 0 {
		sum := *r.CPUUsageUsec + exitedCPU
		out.CPUUsageUsec = &sum
	}
	if len(out.Containers) == 0 {
		out.Containers = nil
	}
	return out
}

// notInSum is the CPU of e, an exited entry, that r's sum does not hold:
// all of it, less r's figure for e's id when r lists it (r was read before
// e exited; a merged entry's predecessors are still not in r).
func notInSum(r source.Reading, e source.Container) uint64 {
	if e.CPUUsageUsec == nil {
		return 0
	}
	v := *e.CPUUsageUsec
	if i := slices.IndexFunc(r.Containers, func(c source.Container) bool { return c.ID == e.ID }); i >= 0 && r.Containers[i].CPUUsageUsec != nil {
		v -= min(v, *r.Containers[i].CPUUsageUsec)
	}
	return v
}

// restoreExited sets a restored activation's set and exited containers
// (from the state file).
func (a *Activation) restoreExited(set []source.ContainerRef, ex exitedState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.set = slices.Clone(set)
	a.exited = ex
}

// validateExited checks the exited containers of a state file.
func validateExited(ex exitedState) error {
	if len(ex.Containers) > MaxExited || ex.Folded < 0 || len(ex.Prior) > MaxExited {
		return fmt.Errorf("%d exited containers (at most %d), %d folded, %d merged", len(ex.Containers), MaxExited, ex.Folded, len(ex.Prior))
	}
	all := slices.Clone(ex.Containers)
	for id, p := range ex.Prior {
		if !slices.ContainsFunc(ex.Containers, func(c source.Container) bool { return c.ID == id }) {
			return fmt.Errorf("exited container merged into %q, which is not among them", id)
		}
		all = append(all, p) // checked alike
	}
	for i, c := range all {
		if c.ID == "" || len(c.ID) > maxContainerBytes || len(c.Name) > maxNameBytes || len(c.Absent) > len(counterFields) {
			return fmt.Errorf("exited container %d: not a valid entry", i)
		}
		for _, x := range c.Absent {
			if len(x.Reason) > maxExitedReasonBytes {
				return fmt.Errorf("exited container %d: a reason of %d bytes", i, len(x.Reason))
			}
		}
	}
	return nil
}

// maxExitedReasonBytes bounds an exited container's absent reason as kept
// (and persisted: binding.json's cap counts 25 exited containers of 64
// bindings with two such reasons each).
const maxExitedReasonBytes = 256

// This file splits a gVisor sandbox's application CPU among its containers
// by increments: each sample shares the increase of the application part
// (the sandbox cgroup's CPU minus the sentry's and gofers' own) since the
// part already split in the proportions of the increase of the sentry's
// per-container figures, so a container's figure never goes down and one
// that exits leaves the others' unchanged.

package gvisor

import (
	"math/bits"
	"sync"
)

// maxSplitTracked caps the containers a splitter remembers; past it, those
// no longer listed are forgotten.
const maxSplitTracked = 4096

// splitter is the split's state for one binding. Safe for concurrent use:
// samples are serialized under mu.
type splitter struct {
	mu      sync.Mutex
	sid     string            // the sandbox the state is about; another resets it
	own     uint64            // the processes' own usec, the highest seen
	split   uint64            // usec of the application part already split
	prev    map[string]uint64 // each container's raw sentry figure (ns) last split by
	attr    map[string]uint64 // each container's attributed usec
	pending uint64            // usec of the application part left for a later sample (for tests and logs)
	// listed is the last sample's Raw (the containers listed then): what a
	// saved state keeps first (breakdownstate.go).
	listed map[string]uint64
}

// splitInput is one sample's figures.
type splitInput struct {
	SandboxID  string
	CgroupUsec uint64            // the sandbox cgroup's CPU
	OwnUsec    uint64            // the sentry's and gofers' host CPU (0: split the whole cgroup)
	Raw        map[string]uint64 // the sentry's figure (ns) of every container it lists now, pause included
}

// advance applies one sample and returns each container of in.Raw's
// attributed usec and the processes' own usec (the highest seen). A sample
// whose application part is not above the part already split (a cgroup read
// older than the last split's) changes nothing. When the sentry's figures
// did not grow, the increase waits for a later sample.
func (s *splitter) advance(in splitInput) (attr map[string]uint64, own uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prev == nil || in.SandboxID != s.sid {
		s.sid, s.own, s.split, s.pending = in.SandboxID, 0, 0, 0
		s.prev, s.attr = map[string]uint64{}, map[string]uint64{}
	}
	s.own = max(s.own, in.OwnUsec)
	var app uint64
	if in.CgroupUsec > s.own {
		app = in.CgroupUsec - s.own
	}
	if app > s.split {
		dA := app - s.split
		var sum uint64
		dr := make(map[string]uint64, len(in.Raw))
		for c, r := range in.Raw {
			if p := s.prev[c]; r > p {
				dr[c] = r - p
				if sum+dr[c] < sum {
					sum = ^uint64(0) // saturate; cannot happen with ns since boot
				} else {
					sum += dr[c]
				}
			}
		}
		var given uint64
		if sum > 0 {
			for c, d := range dr {
				hi, lo := bits.Mul64(dA, min(d, sum))
				part, _ := bits.Div64(hi, lo, sum) // hi < sum: the part is at most dA
				s.attr[c] += part
				given += part
			}
		}
		if given > 0 {
			s.split += given
			for c, r := range in.Raw {
				s.prev[c] = max(s.prev[c], r)
			}
		}
		s.pending = app - s.split
	}
	if len(s.attr) > maxSplitTracked {
		for c := range s.attr {
			if _, ok := in.Raw[c]; !ok {
				delete(s.attr, c)
				delete(s.prev, c)
			}
		}
	}
	s.listed = in.Raw
	attr = make(map[string]uint64, len(in.Raw))
	for c := range in.Raw {
		attr[c] = s.attr[c]
	}
	return attr, s.own
}

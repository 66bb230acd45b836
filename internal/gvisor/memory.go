// This file fills the memory block (current, peak, working set) that the
// v1 and v2 readers share.

package gvisor

import (
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// workingSet is usage minus inactive file pages, floored at 0 (the two files
// are read a moment apart), or usage when inactive file is unknown.
func workingSet(usage, inactive uint64, ok bool) uint64 {
	if !ok {
		return usage
	}
	if inactive > usage {
		return 0
	}
	return usage - inactive
}

// readMemory fills current (required), peak (absent with peakMissing when the
// file is not there) and the working set (current minus the inactiveKey of
// memory.stat, floored at 0) from files already read.
func readMemory(r *source.Reading, cur, peak, stat *fileReq, inactiveKey string, peakMissing func() string) error {
	var err error
	if r.MemoryCurrentBytes, err = reqUint(cur); err != nil {
		return err
	}
	p, ok, err := optUint(peak)
	if err != nil {
		return err
	}
	if ok {
		r.MemoryPeakBytes = &p
	} else {
		r.Absent = append(r.Absent, source.Absent{Field: "memory_peak_bytes", Reason: peakMissing()})
	}
	inactive, ok, err := optKeyed(stat, inactiveKey)
	if err != nil {
		return err
	}
	r.MemoryWorkingSetBytes = workingSet(r.MemoryCurrentBytes, inactive, ok)
	return nil
}

package testenv

import "github.com/prometheus/procfs"

// ProcMemory returns a process's resident set and its peak (VmRSS and VmHWM
// of /proc/<pid>/status, read through procfs), in bytes; pid 0 is this
// process. The tests' one reader of them.
func ProcMemory(pid int) (rss, peak int64, err error) {
	var p procfs.Proc
	if pid == 0 {
		p, err = procfs.Self()
	} else {
		p, err = procfs.NewProc(pid)
	}
	if err != nil {
		return 0, 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, 0, err
	}
	return int64(st.VmRSS), int64(st.VmHWM), nil
}

// ProcAnonymous returns a process's anonymous memory and its proportional
// set size (Anonymous and Pss of /proc/<pid>/smaps_rollup, read through
// procfs), in bytes.
func ProcAnonymous(pid int) (anon, pss uint64, err error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, 0, err
	}
	r, err := p.ProcSMapsRollup()
	if err != nil {
		return 0, 0, err
	}
	return r.Anonymous, r.Pss, nil
}

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

package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStatusKB returns a "<Field>: <n> kB" line's number (VmRSS, VmHWM,
// ...) from /proc/<pid>/status, in KiB; pid 0 is this process. The one
// reader of those lines for the tests that hold a process's memory to a
// bound.
func ProcStatusKB(pid int, field string) (int64, error) {
	p := "/proc/self/status"
	if pid != 0 {
		p = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", p, field, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: no %s line", p, field)
}

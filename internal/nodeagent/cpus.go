package nodeagent

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"strconv"
)

// defaultCPUOnlinePath lists the node's online CPUs (the kernel's CPU
// list format). Unlike runtime.NumCPU, which follows this process's CPU
// affinity (a pinned cpuset is smaller than the node), it is the node's:
// the Accountant's bound is on what every sandbox of the node together
// could have used.
const defaultCPUOnlinePath = "/sys/devices/system/cpu/online"

// maxCPUID bounds a CPU number in a list (the kernel's NR_CPUS is at most
// 8192 today): past it the list is not believed.
const maxCPUID = 1 << 16

// parseCPUList returns how many CPUs a kernel CPU list names: comma
// separated numbers and ranges ("0-3,8,10-11"), ascending and disjoint, a
// trailing newline allowed. Anything else is an error.
func parseCPUList(b []byte) (int, error) {
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 {
		return 0, errors.New("empty CPU list")
	}
	n, next := 0, 0 // next: the lowest CPU number the next part may name
	for part := range bytes.SplitSeq(b, []byte(",")) {
		lo, hi, isRange := bytes.Cut(part, []byte("-"))
		first, err := cpuID(lo)
		if err != nil {
			return 0, err
		}
		last := first
		if isRange {
			if last, err = cpuID(hi); err != nil {
				return 0, err
			}
		}
		if first < next || last < first {
			return 0, errors.New("CPU list not ascending: " + strconv.Quote(string(part)))
		}
		n += last - first + 1
		next = last + 1
	}
	return n, nil
}

// cpuID parses one CPU number: decimal digits only, at most maxCPUID.
func cpuID(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 6 {
		return 0, errors.New("bad CPU number " + strconv.Quote(string(b)))
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errors.New("bad CPU number " + strconv.Quote(string(b)))
		}
		v = v*10 + int(c-'0')
	}
	if v > maxCPUID {
		return 0, errors.New("CPU number past " + strconv.Itoa(maxCPUID) + ": " + string(b))
	}
	return v, nil
}

// nodeCPUs returns the node's online CPUs as path lists them, and
// runtime.NumCPU() (this process's, which may be fewer) when it cannot be
// read or parsed (err says why; nil when path was used).
func nodeCPUs(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		var n int
		if n, err = parseCPUList(b); err == nil {
			return n, nil
		}
	}
	return runtime.NumCPU(), err
}

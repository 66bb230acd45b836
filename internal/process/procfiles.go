package process

// This file reads the few /proc files statsd needs: a process's or a
// thread's stat, schedstat, comm and cmdline, a directory's pids, and the
// CPU lines of /proc/stat. statsd read them through procfs before; its
// package-level regular expressions, compiled at start for files statsd
// never reads, cost an idle statsd 0.15 MiB of its 2.6 MiB (issue 33).

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// Stat is what statsd reads of a /proc/<pid>/stat (or a thread's
// task/<tid>/stat). Times are in USER_HZ clock ticks.
type Stat struct {
	Comm      string // field 2, between the first '(' and the last ')'
	State     string // field 3
	PPID      int    // field 4
	UTime     uint64 // field 14
	STime     uint64 // field 15
	Starttime uint64 // field 22, after boot
	GuestTime uint64 // field 43; 0 when the line stops before it
}

// ParseStat parses a stat line from the last ')' (the command name before
// it may hold any byte, ')' and spaces included). Fields 3 to 22 are
// required; the kernel writes 52.
func ParseStat(b []byte) (Stat, error) {
	l, r := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if l < 0 || r < l {
		return Stat{}, fmt.Errorf("%w: no command name in (): %s", ErrMalformedStat, foreign.QuoteBytes(b))
	}
	f := bytes.Fields(b[r+1:]) // f[n] is field n+3
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("%w: %d fields after the command name, want at least 20", ErrMalformedStat, len(f))
	}
	var bad []byte // the first field that is not a number
	num := func(field int) uint64 {
		v, err := strconv.ParseUint(string(f[field-3]), 10, 64)
		if err != nil && bad == nil {
			bad = f[field-3]
		}
		return v
	}
	st := Stat{Comm: string(b[l+1 : r]), State: string(f[0]), UTime: num(14), STime: num(15), Starttime: num(22)}
	ppid := num(4)
	if len(f) > 43-3 {
		st.GuestTime = num(43)
	}
	if bad != nil || ppid > math.MaxInt32 {
		return Stat{}, fmt.Errorf("%w: not a pid or a count of ticks: %s", ErrMalformedStat, foreign.QuoteBytes(bad))
	}
	st.PPID = int(ppid)
	return st, nil
}

// The Read functions read one file of dir, a process's (<proc>/<pid>) or
// a thread's (<proc>/<pid>/task/<tid>) directory. A read error is the
// read's *fs.PathError (IsGone tells a process gone); a parse error wraps
// ErrMalformedStat and does not name the file (callers do).

// ReadStat reads and parses <dir>/stat.
func ReadStat(dir string) (Stat, error) {
	b, err := bounded.ReadFile(filepath.Join(dir, "stat"), bounded.MaxFileBytes)
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// ReadComm reads <dir>/comm, without its white space around.
func ReadComm(dir string) (string, error) {
	b, err := bounded.ReadFile(filepath.Join(dir, "comm"), bounded.MaxFileBytes)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadCmdline reads <dir>/cmdline as its NUL-separated arguments (none for
// an empty file: a kernel thread, a zombie).
func ReadCmdline(dir string) ([]string, error) {
	b, err := bounded.ReadFile(filepath.Join(dir, "cmdline"), bounded.MaxFileBytes)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return []string{}, nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00"), nil
}

// Schedstat is a thread's <dir>/schedstat: time on a CPU and waiting for
// one, in nanoseconds, and its timeslices.
type Schedstat struct {
	RunningNanoseconds uint64
	WaitingNanoseconds uint64
	RunTimeslices      uint64
}

// ReadSchedstat reads <dir>/schedstat: three decimals.
func ReadSchedstat(dir string) (Schedstat, error) {
	b, err := bounded.ReadFile(filepath.Join(dir, "schedstat"), bounded.MaxFileBytes)
	if err != nil {
		return Schedstat{}, err
	}
	f := bytes.Fields(b)
	var v [3]uint64
	if len(f) < len(v) {
		return Schedstat{}, fmt.Errorf("%w: schedstat has %d fields, want 3", ErrMalformedStat, len(f))
	}
	for i := range v {
		if v[i], err = strconv.ParseUint(string(f[i]), 10, 64); err != nil {
			return Schedstat{}, fmt.Errorf("%w: schedstat field %d: %w", ErrMalformedStat, i+1, err)
		}
	}
	return Schedstat{RunningNanoseconds: v[0], WaitingNanoseconds: v[1], RunTimeslices: v[2]}, nil
}

// PIDs lists the numeric entries of dir (<proc> or <proc>/<pid>/task), in
// the directory's order.
func PIDs(dir string) ([]int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.ParseInt(n, 10, 32); err == nil && pid > 0 {
			pids = append(pids, int(pid))
		}
	}
	return pids, nil
}

// CPUStat is one cpu line of /proc/stat, in USER_HZ clock ticks. User
// includes Guest and Nice includes GuestNice, as the kernel counts them.
type CPUStat struct {
	User, Nice, System, Idle, Iowait, IRQ, SoftIRQ, Steal, Guest, GuestNice uint64
}

// ParseCPUStat parses the cpu lines of /proc/stat: the "cpu" line (total)
// and the "cpuN" lines, by CPU number. Other lines are not read. A line may
// stop before the last columns (older kernels): those are 0.
func ParseCPUStat(b []byte) (total CPUStat, perCPU map[int64]CPUStat, err error) {
	perCPU = map[int64]CPUStat{}
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) == 0 || !bytes.HasPrefix(f[0], []byte("cpu")) {
			continue
		}
		if len(f) < 2 {
			return CPUStat{}, nil, fmt.Errorf("%w: /proc/stat line %s: no figures", ErrMalformedStat, foreign.QuoteBytes(line))
		}
		var v [10]uint64
		for i := 1; i < len(f) && i <= len(v); i++ {
			if v[i-1], err = strconv.ParseUint(string(f[i]), 10, 64); err != nil {
				return CPUStat{}, nil, fmt.Errorf("%w: /proc/stat line %s: %w", ErrMalformedStat, foreign.QuoteBytes(line), err)
			}
		}
		c := CPUStat{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]}
		if len(f[0]) == len("cpu") {
			total = c
			continue
		}
		id, err := strconv.ParseInt(string(f[0][len("cpu"):]), 10, 64)
		if err != nil || id < 0 {
			return CPUStat{}, nil, fmt.Errorf("%w: /proc/stat line %s: not a CPU number", ErrMalformedStat, foreign.QuoteBytes(line))
		}
		perCPU[id] = c
	}
	return total, perCPU, nil
}

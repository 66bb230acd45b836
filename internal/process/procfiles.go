package process

// This file reads the few /proc files statsd needs: a process's or a
// thread's stat, schedstat, comm and cmdline, a directory's pids, and the
// CPU lines of /proc/stat. statsd read them through procfs before; its
// package-level regular expressions, compiled at start for files statsd
// never reads, cost an idle statsd 0.15 MiB of its 2.6 MiB (issue 33).
// The stat parser, ParseStatFields, is also gvisor's for the sandbox's own
// CPU at every sample: it does not allocate.

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
// task/<tid>/stat): its command name and StatFields.
type Stat struct {
	Comm string // field 2, between the first '(' and the last ')'
	StatFields
}

// StatFields is what ParseStatFields reads of a stat line without
// allocating. Times are in USER_HZ clock ticks (UserHZ).
type StatFields struct {
	State     byte   // field 3, one letter ('R', 'S', 'Z', ...)
	PPID      int    // field 4
	UTime     uint64 // field 14
	STime     uint64 // field 15
	Starttime uint64 // field 22, after boot
	VSize     uint64 // field 23, virtual memory size in bytes; 0 when the line stops before it
	RSS       uint64 // field 24, resident set size in pages; 0 when the line stops before it
	GuestTime uint64 // field 43; 0 when the line stops before it
}

// UserHZ is USER_HZ, the unit of the tick fields of /proc/<pid>/stat. It is
// 100 on every Linux architecture (sysconf(_SC_CLK_TCK)); the kernel's HZ may
// differ but is converted before it reaches userspace.
const UserHZ = 100

// ParseStat parses a stat line (ParseStatFields) and its command name.
func ParseStat(b []byte) (Stat, error) {
	f, err := ParseStatFields(b)
	if err != nil {
		return Stat{}, err
	}
	return Stat{Comm: string(b[bytes.IndexByte(b, '(')+1 : bytes.LastIndexByte(b, ')')]), StatFields: f}, nil
}

// ParseStatFields parses a stat line from the last ')' (the command name
// before it, after the first '(', may hold any byte, ')' and spaces
// included), its fields split at ASCII white space. Fields 3 to 22 are
// required (the kernel writes 52): the state one letter, the others
// unsigned decimals that fit a uint64 (the ppid a pid_t), as are 23, 24
// and 43 when the line has them. It does not
// allocate unless it fails: gvisor's own-CPU read runs it for every own
// process at every sample.
func ParseStatFields(b []byte) (StatFields, error) {
	l, r := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if l < 0 || r < l {
		return StatFields{}, fmt.Errorf("%w: no command name in (): %s", ErrMalformedStat, foreign.QuoteBytes(b))
	}
	// f[n] is field n+3 (f[0] the state); fields 3 to 24 and 43 are kept,
	// 3 to 22 required.
	var f [22][]byte
	var guest []byte
	n := 0
	for rest := b[r+1:]; ; n++ {
		for len(rest) > 0 && asciiSpace(rest[0]) {
			rest = rest[1:]
		}
		if len(rest) == 0 {
			break
		}
		j := 0
		for j < len(rest) && !asciiSpace(rest[j]) {
			j++
		}
		switch {
		case n < len(f):
			f[n] = rest[:j]
		case n == 43-3:
			guest = rest[:j]
		}
		rest = rest[j:]
	}
	if n < 20 {
		return StatFields{}, fmt.Errorf("%w: %d fields after the command name, want at least 20", ErrMalformedStat, n)
	}
	if len(f[0]) != 1 || !letter(f[0][0]) {
		return StatFields{}, fmt.Errorf("%w: field 3: not a state: %s", ErrMalformedStat, foreign.QuoteBytes(f[0]))
	}
	st := StatFields{State: f[0][0]}
	ppid, err := statNumber(f[4-3], 4)
	if err == nil && ppid > math.MaxInt32 {
		err = fmt.Errorf("%w: field 4: not a pid: %d", ErrMalformedStat, ppid)
	}
	if err == nil {
		st.UTime, err = statNumber(f[14-3], 14)
	}
	if err == nil {
		st.STime, err = statNumber(f[15-3], 15)
	}
	if err == nil {
		st.Starttime, err = statNumber(f[22-3], 22)
	}
	if err == nil && f[23-3] != nil {
		st.VSize, err = statNumber(f[23-3], 23)
	}
	if err == nil && f[24-3] != nil {
		st.RSS, err = statNumber(f[24-3], 24)
	}
	if err == nil && guest != nil {
		st.GuestTime, err = statNumber(guest, 43)
	}
	if err != nil {
		return StatFields{}, err
	}
	st.PPID = int(ppid)
	return st, nil
}

// statNumber parses field, an unsigned decimal token of a stat line.
func statNumber(tok []byte, field int) (uint64, error) {
	v, ok := decimal(tok)
	if !ok {
		return 0, fmt.Errorf("%w: field %d: not a pid or a count of ticks: %s", ErrMalformedStat, field, foreign.QuoteBytes(tok))
	}
	return v, nil
}

// letter: a state is one (R, S, D, Z, I, ...).
func letter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func asciiSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// decimal parses an unsigned decimal that fits a uint64
// (strconv.ParseUint's base 10 without a string).
func decimal(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
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

// ParseBootTime returns the "btime" line of /proc/stat: when the machine
// booted, in seconds since the Unix epoch.
func ParseBootTime(b []byte) (uint64, error) {
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) == 0 || string(f[0]) != "btime" {
			continue
		}
		if len(f) != 2 {
			return 0, fmt.Errorf("%w: /proc/stat line %s: want btime and one figure", ErrMalformedStat, foreign.QuoteBytes(line))
		}
		v, ok := decimal(f[1])
		if !ok {
			return 0, fmt.Errorf("%w: /proc/stat btime %s: not a count of seconds", ErrMalformedStat, foreign.QuoteBytes(f[1]))
		}
		return v, nil
	}
	return 0, fmt.Errorf("%w: /proc/stat has no btime line", ErrMalformedStat)
}

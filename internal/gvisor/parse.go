package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The parsers below take the bytes of one kernel file and know nothing of
// paths; their errors name the token, and the caller wraps them with the path
// and source.ErrMalformed.

// parseSingleUint parses a file holding one unsigned decimal number and a
// newline, such as memory.current or cpuacct.usage. "max" (the v2 spelling of
// unlimited) is not a number and is rejected: no usage file may hold it.
func parseSingleUint(b []byte) (uint64, error) {
	t, err := oneToken(b, "one number")
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(t), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("token %q: %w", t, err)
	}
	return v, nil
}

// oneToken returns the only token of a one-value file (surrounding white
// space trimmed), a slice of b; want says what the token should be.
func oneToken(b []byte, want string) ([]byte, error) {
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return nil, errors.New("empty file")
	}
	if bytes.ContainsAny(t, " \t\n") {
		return nil, fmt.Errorf("token %q: want %s", t, want)
	}
	return t, nil
}

// nextField returns the first field of b and what follows it, splitting
// where strings.Fields splits (on unicode.IsSpace), without allocating;
// field is empty when b holds none.
func nextField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) {
		r, n := rune(b[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(b[i:])
		}
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	j := i
	for j < len(b) {
		r, n := rune(b[j]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(b[j:])
		}
		if unicode.IsSpace(r) {
			break
		}
		j += n
	}
	return b[i:j], b[j:]
}

// countFields counts the fields of b as strings.Fields would (for error
// messages).
func countFields(b []byte) int {
	n := 0
	for f, rest := nextField(b); len(f) > 0; f, rest = nextField(rest) {
		n++
	}
	return n
}

// eachKeyed calls fn with each "key value" line of a flat keyed file
// (memory.stat, cpu.stat, memory.oom_control), in order, without
// allocating. Every line must have that shape and a number for its value; a
// malformed line anywhere makes the file malformed (even after fn has seen
// earlier lines). key is a slice of b.
func eachKeyed(b []byte, fn func(key []byte, v uint64)) error {
	for n := 1; len(b) > 0; n++ {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		k, v, err := parseKeyedLine(line)
		if err != nil {
			return fmt.Errorf("line %d %q: %w", n, line, err)
		}
		fn(k, v)
	}
	return nil
}

// parseKeyed finds key in a flat keyed file ("key value" per line, as
// memory.stat and cpu.stat). Every line must have that shape and a number for
// its value; a malformed line anywhere makes the file malformed. ok is false
// when the file is well formed but has no such key. The first occurrence of
// key wins.
func parseKeyed(b []byte, key string) (v uint64, ok bool, err error) {
	err = eachKeyed(b, func(k []byte, val uint64) {
		if !ok && string(k) == key {
			v, ok = val, true
		}
	})
	if err != nil {
		return 0, false, err
	}
	return v, ok, nil
}

func parseKeyedLine(line []byte) ([]byte, uint64, error) {
	k, rest := nextField(line)
	val, rest := nextField(rest)
	if extra, _ := nextField(rest); len(val) == 0 || len(extra) > 0 {
		return nil, 0, fmt.Errorf("want \"key value\", got %d fields", countFields(line))
	}
	v, err := strconv.ParseUint(string(val), 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("token %q: %w", val, err)
	}
	return k, v, nil
}

// parseProcs counts the processes listed in cgroup.procs (one pid a line).
// cgroup v2 lists a process outside the reader's pid namespace as 0 (statsd
// in a pod without the host's pid namespace): it counts.
func parseProcs(b []byte) (uint32, error) {
	var n uint32
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if _, err := strconv.ParseUint(string(line), 10, 32); err != nil {
			return 0, fmt.Errorf("token %q: not a pid", line)
		}
		n++
	}
	return n, nil
}

// procCgroup is /proc/<pid>/cgroup: the v1 path of each controller and, when
// the process is also in a v2 hierarchy, its "0::" path. Paths are as the
// kernel prints them, relative to the reader's cgroup namespace.
type procCgroup struct {
	V1         map[string]string // controller ("memory", "cpuacct", "name=systemd") -> path
	Unified    string
	HasUnified bool
}

// inRootOnly reports whether every hierarchy of the process is at its root
// ("/"), as for a process whose cgroups say nothing about what it belongs to.
func (pc procCgroup) inRootOnly() bool {
	if pc.HasUnified && pc.Unified != "/" {
		return false
	}
	for _, p := range pc.V1 {
		if p != "/" {
			return false
		}
	}
	return true
}

// parseProcCgroup parses /proc/<pid>/cgroup ("hierarchy-id:controllers:path"
// per line; a path may itself contain ':').
func parseProcCgroup(b []byte) (procCgroup, error) {
	pc := procCgroup{V1: map[string]string{}}
	for n, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctrls, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return procCgroup{}, fmt.Errorf("line %d %q: want \"id:controllers:path\"", n+1, line)
		}
		if _, err := strconv.ParseUint(id, 10, 32); err != nil {
			return procCgroup{}, fmt.Errorf("line %d %q: token %q: hierarchy id is not a number", n+1, line, id)
		}
		if !strings.HasPrefix(p, "/") {
			return procCgroup{}, fmt.Errorf("line %d %q: token %q: path is not absolute", n+1, line, p)
		}
		if id == "0" && ctrls == "" {
			pc.Unified, pc.HasUnified = p, true
			continue
		}
		if ctrls == "" {
			return procCgroup{}, fmt.Errorf("line %d %q: v1 hierarchy without controllers", n+1, line)
		}
		for c := range strings.SplitSeq(ctrls, ",") {
			if c == "" {
				return procCgroup{}, fmt.Errorf("line %d %q: empty controller name", n+1, line)
			}
			pc.V1[c] = p
		}
	}
	return pc, nil
}

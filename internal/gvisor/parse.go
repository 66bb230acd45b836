package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The parsers below take the bytes of one kernel file and know nothing of
// paths; their errors name the token, and the caller wraps them with the path
// and source.ErrMalformed.

// parseSingleUint parses a file holding one unsigned decimal number and a
// newline, such as memory.current or cpuacct.usage. "max" (the v2 spelling of
// unlimited) is not a number and is rejected: no usage file may hold it.
func parseSingleUint(b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, errors.New("empty file")
	}
	if strings.ContainsAny(s, " \t\n") {
		return 0, fmt.Errorf("token %q: want one number", s)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("token %q: %w", s, err)
	}
	return v, nil
}

// parseKeyed finds key in a flat keyed file ("key value" per line, as
// memory.stat and cpu.stat). Every line must have that shape and a number for
// its value; a malformed line anywhere makes the file malformed. ok is false
// when the file is well formed but has no such key. The first occurrence of
// key wins.
func parseKeyed(b []byte, key string) (v uint64, ok bool, err error) {
	for n := 1; len(b) > 0; n++ {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		k, val, err := parseKeyedLine(line)
		if err != nil {
			return 0, false, fmt.Errorf("line %d %q: %w", n, line, err)
		}
		if !ok && k == key {
			v, ok = val, true
		}
	}
	return v, ok, nil
}

func parseKeyedLine(line []byte) (string, uint64, error) {
	f := strings.Fields(string(line))
	if len(f) != 2 {
		return "", 0, fmt.Errorf("want \"key value\", got %d fields", len(f))
	}
	v, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("token %q: %w", f[1], err)
	}
	return f[0], v, nil
}

// parseProcs counts the processes listed in cgroup.procs (one pid a line).
func parseProcs(b []byte) (uint32, error) {
	var n uint32
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if pid, err := strconv.ParseUint(line, 10, 32); err != nil || pid == 0 {
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

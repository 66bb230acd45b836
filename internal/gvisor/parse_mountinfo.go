package gvisor

import (
	"fmt"
	"strconv"
	"strings"
)

// mountInfo is the part of one /proc/<pid>/mountinfo line (proc(5)) the
// source needs: which mount it is, where it is mounted and which directory
// of its file system is its root. For a cgroup mount the root is a cgroup
// path relative to the reader's cgroup namespace, as /proc/<pid>/cgroup
// shows them: "/" for a mount made inside the namespace (or on the host),
// "/.." or "/../x" for one made outside it.
type mountInfo struct {
	ID         int
	Root       string
	MountPoint string
	FSType     string
}

// parseMountinfo parses /proc/<pid>/mountinfo: "id parent major:minor root
// mountpoint options [optional fields...] - fstype source superoptions" per
// line. The kernel escapes space, tab, newline and backslash in paths as
// \ooo octal; they are decoded.
func parseMountinfo(b []byte) ([]mountInfo, error) {
	var out []mountInfo
	for n, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 {
			return nil, fmt.Errorf("line %d %q: want \"id parent major:minor root mountpoint options ... - fstype ...\"", n+1, line)
		}
		id, err := strconv.Atoi(f[0])
		if err != nil || id < 0 {
			return nil, fmt.Errorf("line %d %q: token %q: mount id is not a number", n+1, line, f[0])
		}
		root, err := unescapeMountPath(f[3])
		if err != nil {
			return nil, fmt.Errorf("line %d %q: root: %w", n+1, line, err)
		}
		mp, err := unescapeMountPath(f[4])
		if err != nil {
			return nil, fmt.Errorf("line %d %q: mount point: %w", n+1, line, err)
		}
		if !strings.HasPrefix(root, "/") || !strings.HasPrefix(mp, "/") {
			return nil, fmt.Errorf("line %d %q: root %q or mount point %q is not absolute", n+1, line, root, mp)
		}
		out = append(out, mountInfo{ID: id, Root: root, MountPoint: mp, FSType: g[0]})
	}
	return out, nil
}

// unescapeMountPath decodes the kernel's \ooo escapes in a mountinfo path.
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("token %q: truncated escape", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("token %q: bad escape %q", s, s[i:i+4])
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

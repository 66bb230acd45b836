// This file finds where this process's cgroup namespace is rooted inside a
// cgroup mount made outside the namespace (the host's /sys/fs/cgroup,
// bind-mounted into a container that containerd gave a private cgroup
// namespace: mountinfo shows its root as "/../../.."), so that the paths
// /proc/<pid>/cgroup shows for processes outside the namespace ("/../../x")
// can be read through it.

package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// Bounds of one scan for this process's own cgroup (findNSRoot).
const (
	// maxNSDepth: a mount rooted more than this many levels above the
	// namespace's root is refused (Kubernetes' containers sit 3-4 deep).
	maxNSDepth = 16
	// maxNSScanDirs bounds the cgroups (directories) one scan lists and
	// whose cgroup.procs it reads (a node with 110 pods has about 500
	// cgroups at the depth of its containers); interface files do not count.
	maxNSScanDirs = 20000
	// maxNSScanEntries bounds the raw entries one scan goes through, files
	// included (a cgroup v2 directory holds 60-80 interface files): the
	// memory and time bound against a mount full of something else.
	maxNSScanEntries = 2_000_000
	// nsRetry: a failed scan is not repeated for this long (the process's
	// cgroup does not change while it runs; a found root is kept for good).
	nsRetry = 30 * time.Second
)

// nsKey names one scan: the mount's directory and its root as this
// namespace sees it, this process's cgroup in that hierarchy, and its pid.
type nsKey struct {
	dir, root, own string
	pid            int
}

type nsResult struct {
	nsRoot string
	err    error
	at     time.Time
}

// nsRoots caches the scans of this process: every source bound by sentry pid
// shares them.
var nsRoots = struct {
	mu sync.Mutex
	m  map[nsKey]nsResult
}{m: map[nsKey]nsResult{}}

// nsScans runs the scans of one key once for the whole process, whatever the
// source asking (the sources restored at statsd's start open together).
var nsScans = bounded.New(0)

// Causes of a scan's failure that are no advice to mount something else
// (mountRoot.inMount words its refusal by them).
var (
	errNSTooMany = errors.New("too many cgroups to scan")
)

// cachedNSRoot is findNSRoot, once per key (a failure again after nsRetry),
// its scan bounded by timeout. A caller that gives up at timeout gets an
// error wrapping source.ErrTimeout, not cached: the scan goes on and caches
// its own answer when it ends.
func cachedNSRoot(ctx context.Context, timeout time.Duration, k nsKey) (string, error) {
	nsRoots.mu.Lock()
	r, ok := nsRoots.m[k]
	nsRoots.mu.Unlock()
	if ok && (r.err == nil || time.Since(r.at) < nsRetry) {
		return r.nsRoot, r.err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	key := fmt.Sprintf("nsroot\x00%s\x00%s\x00%s\x00%d", k.dir, k.root, k.own, k.pid)
	return bounded.Do(ctx, nsScans, key, func() (string, error) {
		p, err := findNSRoot(k.dir, k.root, k.own, k.pid, time.Now().Add(timeout))
		nsRoots.mu.Lock()
		nsRoots.m[k] = nsResult{nsRoot: p, err: err, at: time.Now()}
		nsRoots.mu.Unlock()
		return p, err
	})
}

// findNSRoot finds where the cgroup namespace of the process pid (its pid in
// this process's pid namespace, whose cgroup is own as this namespace sees
// it) is rooted inside the cgroup mount at dir, whose root this namespace
// sees as root ("/" followed by k ".." elements, k >= 1). The namespace's
// root is then k levels below the mount's root, its names unknown: the scan
// lists the directories of the mount down to depth k (at most maxNSScanDirs,
// until deadline) and takes the one directory D whose D/own/cgroup.procs
// lists pid. cgroup.procs shows pids as the reader's pid namespace sees them
// (a process outside it reads as 0 on v2 and is left out on v1), so only the
// reader's own cgroup lists its own pid. It returns D as a path inside the
// mount ("/a/b/c").
func findNSRoot(dir, root, own string, pid int, deadline time.Time) (string, error) {
	k, err := dotDots(root)
	if err != nil {
		return "", err
	}
	if hasDotDot(own) {
		return "", fmt.Errorf("this process's own cgroup %q is outside its cgroup namespace", own)
	}
	want := []byte(strconv.Itoa(pid))
	level, listed, entries := []string{"/"}, 0, 0
	for depth := 0; depth < k; depth++ {
		var next []string
		for _, d := range level {
			if time.Now().After(deadline) {
				return "", fmt.Errorf("looking for this process's cgroup in %s: %w after %d directories", dir, os.ErrDeadlineExceeded, listed)
			}
			ents, err := os.ReadDir(filepath.Join(dir, d))
			if err != nil {
				continue // removed meanwhile
			}
			for _, e := range ents {
				if e.IsDir() {
					next = append(next, path.Join(d, e.Name()))
					listed++
				}
			}
			if entries += len(ents); listed > maxNSScanDirs || entries > maxNSScanEntries {
				return "", fmt.Errorf("looking for this process's cgroup in %s: %w: more than %d cgroups or %d entries down to depth %d",
					dir, errNSTooMany, maxNSScanDirs, maxNSScanEntries, k)
			}
		}
		level = next
	}
	var found []string
	for i, d := range level {
		if i%64 == 0 && time.Now().After(deadline) {
			return "", fmt.Errorf("looking for this process's cgroup in %s: %w after %d of %d cgroup.procs files", dir, os.ErrDeadlineExceeded, i, len(level))
		}
		b, err := bounded.ReadFile(filepath.Join(dir, d, own, "cgroup.procs"), bounded.MaxFileBytes)
		if err != nil {
			continue
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if bytes.Equal(bytes.TrimSpace(line), want) {
				found = append(found, d)
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no cgroup %d levels below the root of %s lists pid %d (this process) in %s/cgroup.procs (%d cgroups looked at)",
			k, dir, pid, strings.TrimPrefix(path.Join("x", own), "x"), len(level))
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("cgroups %q of %s all list pid %d (this process) in cgroup.procs", found, dir, pid)
}

// dotDots counts the ".." elements of a mount root "/../..", refusing one
// with names after them (a subtree beside the namespace's, where this
// process's cgroup is not) or more than maxNSDepth of them.
func dotDots(root string) (int, error) {
	k := 0
	for e := range strings.SplitSeq(strings.Trim(path.Clean(strings.TrimPrefix(root, "/")), "/"), "/") {
		if e != ".." {
			return 0, fmt.Errorf("the mount's root %q is a cgroup beside this namespace's, not above it: this process's cgroup is not in it", root)
		}
		k++
	}
	if k > maxNSDepth {
		return 0, fmt.Errorf("the mount's root %q is more than %d levels above this namespace's", root, maxNSDepth)
	}
	return k, nil
}

// joinWithin joins p, a cgroup path relative to the namespace ("/x" or
// "/../../x", cleaned), onto nsRoot, the namespace's root inside a mount; ok
// is false when p leads above the mount's root.
func joinWithin(nsRoot, p string) (string, bool) {
	parts := strings.FieldsFunc(nsRoot, func(r rune) bool { return r == '/' })
	for e := range strings.SplitSeq(p, "/") {
		switch e {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", false
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, e)
		}
	}
	return "/" + strings.Join(parts, "/"), true
}

// pidsHidden reports whether this process sees procRoot's processes from a
// pid namespace of its own: procRoot/self names it by another pid than its
// own (a pod without hostPID, the host's /proc mounted at /host/proc). A
// procRoot/self that is no link (a fixture tree) says no.
func pidsHidden(procRoot string) bool {
	l, err := os.Readlink(filepath.Join(procRoot, "self"))
	return err == nil && l != strconv.Itoa(os.Getpid())
}

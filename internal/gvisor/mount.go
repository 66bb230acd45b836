// This file finds where each cgroup mount the source reads is rooted, as
// this process's cgroup namespace sees it, and turns the paths of
// /proc/<pid>/cgroup (relative to that namespace) into paths inside the
// mount.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// mountRoot is one cgroup mount: its directory and its root as this
// process's cgroup namespace sees it (mountInfo.Root). root is "" when it
// is not known (no mountinfo, or dir is no cgroup mount: a fixture tree);
// the paths of /proc/<pid>/cgroup are then read as they are, as for "/".
//
// A mount rooted outside the namespace ("/../..") holds the paths of
// processes outside it too once nsRoot, the namespace's root inside the
// mount, is found (nsroot.go); nsErr says why it was not.
type mountRoot struct {
	dir, root string
	nsRoot    string
	nsErr     error
	// ns is the scan that finds nsRoot (nil when none can: no mountinfo, no
	// own cgroup); withNS asks it again at each resolve until it succeeds.
	ns *nsKey
}

// withNS gives mr with the namespace roots a scan has found since (the cache
// answers at once once found; a failure is retried after nsRetry), bounded by
// timeout: a source opened while the scan failed is not refused for good.
func (mr mountRoots) withNS(ctx context.Context, timeout time.Duration) mountRoots {
	for _, m := range []*mountRoot{&mr.mem, &mr.cpu, &mr.cfs, &mr.pids, &mr.blkio, &mr.unified} {
		if m.ns != nil && m.nsRoot == "" {
			m.nsRoot, m.nsErr = cachedNSRoot(ctx, timeout, *m.ns)
		}
	}
	return mr
}

// nsWhy words why m's namespace root was not found by its cause: only a
// scan that ended without finding it is advice to mount something else.
func (m mountRoot) nsWhy() string {
	switch {
	case errors.Is(m.nsErr, source.ErrTimeout) || errors.Is(m.nsErr, os.ErrDeadlineExceeded):
		return fmt.Sprintf("the scan for this cgroup namespace's root in it did not end in time (%v); it is tried again every %s", m.nsErr, nsRetry)
	case errors.Is(m.nsErr, errNSTooMany):
		return fmt.Sprintf("the scan for this cgroup namespace's root in it was refused (%v); it is tried again every %s", m.nsErr, nsRetry)
	}
	return fmt.Sprintf("%v: the paths /proc/<pid>/cgroup shows are relative to the namespace and cannot be read through it; mount the host's whole cgroup file system "+
		"at %s (hostPath /sys/fs/cgroup) or one made inside the namespace", m.nsErr, m.dir)
}

// mountRoots are the mounts of the paths a location holds: mem and cpu
// (v2: both the unified mount; v1: the memory and cpuacct hierarchies) and
// those of auxPaths.
type mountRoots struct {
	mem, cpu                  mountRoot
	cfs, pids, blkio, unified mountRoot
}

// inMount turns p, a cgroup path as /proc/<pid>/cgroup shows it (relative
// to this process's cgroup namespace, cleaned by namespacePath: "/x", or
// "/../../x" outside the namespace), into its path inside m. A mount made in
// the namespace (or on a host without one) is rooted at "/" and p is its own
// path there. A mount rooted at a sub-cgroup (a container's cgroup
// bind-mounted as its /sys/fs/cgroup) holds the paths below its root. A
// mount made outside the namespace (the host's, bound into a container with
// a private cgroup namespace) is rooted at "/.." or "/../..": p is read
// there from where this process's namespace was found in it (m.nsRoot),
// never by its names alone (that would read another cgroup, or none, which
// would pass for a dead sandbox). A path in it that is the mount's root is
// errRootCgroup.
func (m mountRoot) inMount(p string) (string, error) {
	switch {
	case hasDotDot(m.root) && m.nsRoot == "":
		return "", fmt.Errorf("the cgroup mount at %s is rooted at %q, outside this process's cgroup namespace, and %s", m.dir, m.root, m.nsWhy())
	case hasDotDot(m.root):
		q, ok := joinWithin(m.nsRoot, p)
		switch {
		case !ok:
			return "", fmt.Errorf("cgroup %q leads above the cgroup mount at %s (rooted at %q; this cgroup namespace is %s in it)", p, m.dir, m.root, m.nsRoot)
		case q == "/":
			return "", errRootCgroup
		}
		return q, nil
	case hasDotDot(p):
		return "", fmt.Errorf("cgroup %q is outside this process's cgroup namespace, and the cgroup mount at %s (rooted at %q) holds only the namespace's cgroups: "+
			"mount the host's whole cgroup file system there (hostPath /sys/fs/cgroup)", p, m.dir, m.root)
	case m.root == "" || m.root == "/":
		return p, nil
	case p == m.root:
		return "/", nil
	case strings.HasPrefix(p, m.root+"/"):
		return p[len(m.root):], nil
	}
	return "", fmt.Errorf("cgroup %q is outside the cgroup mount at %s, whose root is %q", p, m.dir, m.root)
}

func hasDotDot(p string) bool {
	for e := range strings.SplitSeq(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// findMountRoots reads <procRoot>/self/mountinfo once (bounded by g) and
// finds the mounts of the hierarchies a source in mode reads under root. A
// mount it cannot place keeps root "" (read as "/", as before mountinfo was
// read), with a Debug log. A mount rooted outside this process's cgroup
// namespace gets the scan that finds the namespace's root in it (nsroot.go:
// by pid in <procRoot>/self/cgroup's path), run by withNS at each resolve
// until it succeeds, then answered from the process's cache.
func findMountRoots(ctx context.Context, g *bounded.Group, root string, mode Mode, procRoot string, pid int, log *slog.Logger) mountRoots {
	p := filepath.Join(procRoot, "self", "mountinfo")
	mounts, err := bounded.Do(ctx, g, "mountinfo\x00"+p, func() ([]mountInfo, error) {
		b, err := bounded.ReadFile(p, bounded.MaxFileBytes)
		if err != nil {
			return nil, err
		}
		m, err := parseMountinfo(b)
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)
		}
		return m, nil
	})
	var own *procCgroup
	find := func(dir, ctl string) mountRoot {
		if err != nil {
			return mountRoot{dir: dir}
		}
		m := findMountRoot(mounts, dir, log)
		if !hasDotDot(m.root) {
			return m
		}
		if own == nil {
			own = &procCgroup{}
			if *own, m.nsErr = readOwnCgroup(ctx, g, procRoot); m.nsErr != nil {
				return m
			}
		}
		o, ok := own.Unified, own.HasUnified
		if ctl != "" {
			o, ok = own.V1[ctl]
		}
		if !ok || o == "" {
			m.nsErr = fmt.Errorf("this process is in no %q hierarchy (%s)", ctl, filepath.Join(procRoot, "self", "cgroup"))
			return m
		}
		m.ns = &nsKey{dir: dir, root: m.root, own: o, pid: pid} // looked up at each resolve (withNS)
		return m
	}
	if err != nil {
		log.Debug("no mountinfo: reading the sentry's cgroup paths as they are", "path", p, "err", err)
	}
	if mode == ModeUnified {
		u := find(root, "")
		return mountRoots{mem: u, cpu: u}
	}
	mr := mountRoots{
		mem:   find(filepath.Join(root, "memory"), "memory"),
		cpu:   find(filepath.Join(root, "cpuacct"), "cpuacct"),
		cfs:   find(filepath.Join(root, "cpu"), "cpu"),
		pids:  find(filepath.Join(root, "pids"), "pids"),
		blkio: find(filepath.Join(root, "blkio"), "blkio"),
	}
	if mode == ModeHybrid {
		mr.unified = find(filepath.Join(root, "unified"), "")
	}
	return mr
}

// readOwnCgroup reads and parses <procRoot>/self/cgroup: this process's
// cgroups as its own namespace sees them.
func readOwnCgroup(ctx context.Context, g *bounded.Group, procRoot string) (procCgroup, error) {
	p := filepath.Join(procRoot, "self", "cgroup")
	return bounded.Do(ctx, g, "selfcgroup\x00"+p, func() (procCgroup, error) {
		b, err := bounded.ReadFile(p, bounded.MaxFileBytes)
		if err != nil {
			return procCgroup{}, err
		}
		pc, err := parseProcCgroup(b)
		if err != nil {
			return procCgroup{}, fmt.Errorf("%s: %w", p, err)
		}
		return pc, nil
	})
}

// findMountRoot finds the mount holding dir among mounts: by the mount id
// statx reports for dir (mountID), else the last (topmost) mount whose mount
// point is dir. dir inside a mount has the mount's root and its path below
// the mount point as root. A mount that is not a cgroup file system (a
// fixture tree) leaves root "".
func findMountRoot(mounts []mountInfo, dir string, log *slog.Logger) mountRoot {
	m := mountRoot{dir: dir}
	real, err := filepath.EvalSymlinks(dir)
	if err == nil {
		real, err = filepath.Abs(real)
	}
	if err != nil {
		log.Debug("cgroup mount's root unknown: reading the sentry's cgroup paths as they are", "dir", dir, "err", err)
		return m
	}
	var found *mountInfo
	if id, ok := mountID(real); ok {
		for i := range mounts {
			if mounts[i].ID == id {
				found = &mounts[i]
			}
		}
	}
	if found == nil {
		for i := range mounts {
			if mounts[i].MountPoint == real {
				found = &mounts[i]
			}
		}
	}
	if found == nil || (found.FSType != "cgroup" && found.FSType != "cgroup2") {
		return m
	}
	m.root = found.Root
	if sub, err := filepath.Rel(found.MountPoint, real); err == nil && sub != "." && !strings.HasPrefix(sub, "..") {
		m.root = strings.TrimSuffix(found.Root, "/") + "/" + sub
	}
	return m
}

// This file chooses where a sandbox's cgroup is: the location type, the
// choice of paths from /proc/<pid>/cgroup, and the names of paths in a root.

package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// errRootCgroup: a sentry in the root cgroup (runsc --ignore-cgroups) has no
// cgroup of its own; the root's numbers would be the whole host's.
var errRootCgroup = errors.New("the sentry is in the root cgroup (runsc --ignore-cgroups?): the numbers there are the whole host's")

// location is where one sandbox's cgroup is, as paths relative to the mounts
// ("/a/b"). On v2 mem and cpu are the same path. cpu is "" when a resolved
// process has no cpuacct hierarchy.
type location struct {
	mem, cpu string
	// cpuWhy says why cpu is empty when the process has a cpuacct line.
	cpuWhy string
	// aux says where the signal files of the other hierarchies are (v1 and
	// hybrid hosts; on a unified host everything is at mem).
	aux auxPaths
}

// auxPaths are the sandbox's paths in the hierarchies a v1 or hybrid Sample
// reads besides memory and cpuacct: the v1 cpu (CFS bandwidth), pids and
// blkio controllers, and on a hybrid host the unified (v2) hierarchy, whose
// cgroups carry the pressure files. A path that cannot be read is "" with
// the reason in why; its signals are then absent, never the sample.
type auxPaths struct {
	CFS, Pids, Blkio, Unified ctlPath
}

// ctlPath is one hierarchy's path, or why there is none (exported fields in
// an unexported type, so that tests can compare them).
type ctlPath struct{ Path, Why string }

// samePath gives every hierarchy the one path a ref names (bound by cgroup
// path: the launcher made the same relative path in every hierarchy).
func samePath(p string) auxPaths {
	c := ctlPath{Path: p}
	return auxPaths{CFS: c, Pids: c, Blkio: c, Unified: c}
}

// selectAux picks the paths of the other hierarchies from a parsed
// /proc/<pid>/cgroup on a v1 or hybrid host, inside their mounts mr. A
// missing line, a path outside the namespace or the mount, or the
// hierarchy's root (whose numbers would be the whole host's) leaves that
// hierarchy without a path, with the reason.
func selectAux(pc procCgroup, mode Mode, mr mountRoots) auxPaths {
	v1 := func(ctl string, m mountRoot) ctlPath {
		p, ok := pc.V1[ctl]
		if !ok {
			return ctlPath{Why: "the sentry is in no " + ctl + " cgroup (no " + ctl + " line in its /proc/<pid>/cgroup)"}
		}
		return auxPath(p, m, "the sentry's "+ctl+" cgroup is the root of that hierarchy: its numbers would be the whole host's")
	}
	a := auxPaths{CFS: v1("cpu", mr.cfs), Pids: v1("pids", mr.pids), Blkio: v1("blkio", mr.blkio)}
	switch {
	case mode != ModeHybrid:
		a.Unified = ctlPath{Why: "a pure cgroup v1 host: the kernel keeps pressure stall information per cgroup only on cgroup v2"}
	case !pc.HasUnified:
		a.Unified = ctlPath{Why: "the sentry is in no unified (v2) cgroup (no \"0::\" line)"}
	default:
		a.Unified = auxPath(pc.Unified, mr.unified, "the sentry is in the root of the unified (v2) hierarchy (runsc puts a sandbox in no v2 cgroup on a hybrid host): its pressure would be the whole host's")
	}
	return a
}

func auxPath(p string, m mountRoot, rootWhy string) ctlPath {
	np, err := namespacePath(p)
	switch {
	case err != nil:
		return ctlPath{Why: err.Error()}
	case np == "/":
		return ctlPath{Why: rootWhy}
	}
	if np, err = m.inMount(np); errors.Is(err, errRootCgroup) {
		return ctlPath{Why: rootWhy}
	} else if err != nil {
		return ctlPath{Why: err.Error()}
	}
	return ctlPath{Path: np}
}

// selectLocation picks the paths to read from a parsed /proc/<pid>/cgroup:
// the "0::" path on a unified host; the memory and cpuacct lines on a v1 or
// hybrid host (where the "0::" line is there too but has no memory
// controller). /proc shows paths relative to the reader's cgroup namespace (a
// path outside it shows as "/.." and cannot be read); mr says where each
// mount is rooted in that namespace (mount.go), and the paths returned are
// inside the mounts.
func selectLocation(pc procCgroup, mode Mode, mr mountRoots) (*location, error) {
	if mode == ModeUnified {
		if !pc.HasUnified {
			return nil, errors.New("no cgroup v2 (\"0::\") line")
		}
		p, err := namespacePath(pc.Unified)
		if err != nil {
			return nil, err
		}
		if p == "/" {
			return nil, errRootCgroup
		}
		if p, err = mr.mem.inMount(p); err != nil {
			return nil, err
		}
		return &location{mem: p, cpu: p}, nil
	}
	mp, ok := pc.V1["memory"]
	if !ok {
		return nil, errors.New("no v1 memory line")
	}
	mem, err := namespacePath(mp)
	if err != nil {
		return nil, err
	}
	if mem == "/" {
		return nil, errRootCgroup
	}
	if mem, err = mr.mem.inMount(mem); err != nil {
		return nil, err
	}
	loc := &location{mem: mem}
	if cp, ok := pc.V1["cpuacct"]; ok {
		if loc.cpu, err = namespacePath(cp); err != nil {
			return nil, err
		}
		// A process can sit in a memory cgroup of its own but in the root of
		// the separately mounted cpuacct hierarchy: that counter is the
		// whole host's, not the sandbox's.
		if loc.cpu == "/" {
			loc.cpu, loc.cpuWhy = "", "the sentry's cpuacct cgroup is the root: its counter would be the whole host's CPU"
		} else if loc.cpu, err = mr.cpu.inMount(loc.cpu); err != nil {
			return nil, err
		}
	}
	return loc, nil
}

// namespacePath cleans p, a path of /proc/<pid>/cgroup, keeping the ".."
// a path outside this process's cgroup namespace begins with ("/../../x":
// inMount reads it where the namespace is found in the mount, or refuses
// it).
func namespacePath(p string) (string, error) {
	if strings.HasSuffix(p, " (deleted)") {
		return "", fmt.Errorf("cgroup %q: %w", p, errCgroupGone)
	}
	if hasDotDot(p) {
		return "/" + path.Clean(strings.TrimPrefix(p, "/")), nil
	}
	return path.Clean(p), nil
}

// rel turns a cgroup path into a name inside an os.Root.
func rel(p string) string {
	if p = strings.TrimPrefix(p, "/"); p == "" {
		return "."
	}
	return p
}

func display(root *os.Root, dir string) string {
	return filepath.Join(root.Name(), dir)
}

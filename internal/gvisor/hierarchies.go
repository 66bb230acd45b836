// This file opens the hierarchies a v1 or hybrid Sample reads besides
// memory and cpuacct: the v1 cpu, pids and blkio controllers and, on a
// hybrid host, the unified (v2) mount for pressure.

package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
)

// auxRoot is one optional hierarchy, opened as an os.Root like memory and
// cpuacct; r is nil and why says why when it is not there.
type auxRoot struct {
	r   *os.Root
	why string
}

// auxRoots are the optional hierarchies of a v1 or hybrid host.
type auxRoots struct {
	cfs, pids, blkio, unified auxRoot
}

// openAuxRoots opens <root>/cpu, <root>/pids, <root>/blkio (each may be
// missing, or a symlink to a co-mounted "cpu,cpuacct", which OpenRoot
// follows) and, on a hybrid host, <root>/unified. A missing hierarchy is not
// an error: its signals are absent with the reason.
func openAuxRoots(root string, mode Mode, log *slog.Logger) auxRoots {
	open := func(name, what string) auxRoot {
		r, err := os.OpenRoot(filepath.Join(root, name))
		if err != nil {
			log.Debug("no "+name+" hierarchy: "+what+" will be absent", "err", err)
			return auxRoot{why: "no " + name + " hierarchy: " + err.Error()}
		}
		return auxRoot{r: r}
	}
	a := auxRoots{
		cfs:   open("cpu", "CPU throttling"),
		pids:  open("pids", "pids"),
		blkio: open("blkio", "block IO"),
	}
	if mode == ModeHybrid {
		a.unified = open("unified", "pressure")
	} else {
		a.unified = auxRoot{why: "a pure cgroup v1 host: the kernel keeps pressure stall information per cgroup only on cgroup v2"}
	}
	return a
}

// all returns the open roots, for Close.
func (a auxRoots) all() []*os.Root {
	var out []*os.Root
	for _, r := range []auxRoot{a.cfs, a.pids, a.blkio, a.unified} {
		if r.r != nil {
			out = append(out, r.r)
		}
	}
	return out
}

// req returns a request for name in the sandbox's directory of hierarchy r
// at path p, or nil with the reason when either is missing.
func (r auxRoot) req(p ctlPath, name string) (*fileReq, string) {
	switch {
	case r.r == nil:
		return nil, r.why
	case p.Path == "":
		return nil, p.Why
	}
	return &fileReq{root: r.r, dir: p.Path, name: name}, ""
}

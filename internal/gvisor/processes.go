package gvisor

// This file finds a gVisor sandbox's host processes from /proc: the sentry,
// its descendants in its cgroups and its gofer (hoststat lists their threads).

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// SandboxProcesses returns the host pids of the gVisor sandbox whose sentry
// is sentry: the sentry first, then, in pid order, its descendants (ptrace
// stubs, the sandbox's own processes) that are, when the sentry is not in the
// root cgroup, also in the sentry's cgroups, plus its gofer.
//
// Descent is required in every case: with runsc --ignore-cgroups the sentry
// inherits its parent's cgroup (a session scope, say) and sharing it says
// nothing. The one exception is the gofer, the sentry's sibling (runsc starts
// both; both end up children of init): a process in the sentry's own non-root
// cgroup whose argv[0] is runsc-gofer and whose --root= is the sentry's.
//
// It reads every process's stat and, for processes in the
// sentry's cgroups, cgroup and cmdline under procRoot. It blocks: callers
// bound it. A sentry whose cgroup cannot be read is an error wrapping
// source.ErrNotMeasurable, one that does not parse source.ErrMalformed.
func SandboxProcesses(procRoot string, sentry int32) ([]int32, error) {
	cg, err := bounded.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(sentry)), "cgroup"), bounded.MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: sentry %d: %w", source.ErrNotMeasurable, sentry, err)
	}
	pc, err := parseProcCgroup(cg)
	if err != nil {
		return nil, fmt.Errorf("%w: sentry %d: %s: %w", source.ErrMalformed, sentry, filepath.Join(procRoot, strconv.Itoa(int(sentry)), "cgroup"), err)
	}
	rootOnly := pc.inRootOnly()
	all, err := process.PIDs(procRoot)
	if err != nil {
		return nil, err
	}
	parent := map[int32]int32{}
	for _, pid := range all {
		if int32(pid) == sentry {
			continue
		}
		if st, err := process.ReadStat(filepath.Join(procRoot, strconv.Itoa(pid))); err == nil {
			parent[int32(pid)] = int32(st.PPID)
		}
	}
	sentryRoot := runscRoot(procRoot, sentry)
	var same []int32
	for pid := range parent {
		descends := false
		for p, hops := parent[pid], 0; p != 0 && hops < 64; p, hops = parent[p], hops+1 {
			if p == sentry {
				descends = true
				break
			}
		}
		if !descends && (rootOnly || sentryRoot == "") {
			continue
		}
		if !rootOnly {
			b, err := bounded.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"), bounded.MaxFileBytes)
			if err != nil || !bytes.Equal(b, cg) {
				continue
			}
			if !descends && !isGoferOf(procRoot, pid, sentryRoot) {
				continue
			}
		}
		same = append(same, pid)
	}
	slices.Sort(same)
	return append([]int32{sentry}, same...), nil
}

// runscRoot returns the --root a runsc process (sentry or gofer) was started
// with, from its command line, or "".
func runscRoot(procRoot string, pid int32) string {
	args, err := process.ReadCmdline(filepath.Join(procRoot, strconv.Itoa(int(pid))))
	if err != nil {
		return ""
	}
	return runscRootOf(args)
}

// isGoferOf reports whether pid is a runsc gofer started with the given
// runsc --root.
func isGoferOf(procRoot string, pid int32, root string) bool {
	args, err := process.ReadCmdline(filepath.Join(procRoot, strconv.Itoa(int(pid))))
	return err == nil && len(args) > 0 && filepath.Base(args[0]) == "runsc-gofer" && runscRootOf(args) == root
}

func runscRootOf(args []string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--root="); ok {
			return v
		}
	}
	return ""
}

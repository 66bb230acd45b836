// This file reads a cgroup v1 (legacy or hybrid) sandbox cgroup: the memory
// and cpuacct hierarchies.

package gvisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// readV1 reads memory.usage_in_bytes (required), memory.max_usage_in_bytes,
// memory.stat total_inactive_file and cgroup.procs in the memory hierarchy,
// cpuacct.usage (ns) in the cpuacct hierarchy, and the signal and block IO
// files of the memory, cpu, pids, blkio and (hybrid) unified hierarchies
// (signals_v1.go, blkio_v1.go).
func (s *cgroupSource) readV1(ctx context.Context, loc *location) (source.Reading, error) {
	root, dir := s.memory, loc.mem
	req := func(name string) *fileReq { return &fileReq{root: root, dir: dir, name: name} }
	cur, peak, stat := req("memory.usage_in_bytes"), req("memory.max_usage_in_bytes"), req("memory.stat")
	reqs := []*fileReq{cur, peak, stat}
	var pr *fileReq
	if !s.pidsHidden {
		// Hidden pids would make cgroup.procs read empty: v1Procs counts on
		// pids.current alone then.
		pr = req("cgroup.procs")
		reqs = append(reqs, pr)
	}
	sig := s.newV1Signals(loc, req)
	reqs = append(reqs, sig.reqs()...)
	var cpu *fileReq
	if s.cpuacct != nil && loc.cpu != "" {
		cpu = &fileReq{root: s.cpuacct, dir: loc.cpu, name: "cpuacct.usage"}
		reqs = append(reqs, cpu)
	}
	s.readAll(ctx, reqs)

	r := source.Reading{Kind: source.KindCgroup}
	cpuDetail := "cpuacct (none)"
	if cpu != nil {
		cpuDetail = "cpuacct " + display(cpu.root, cpu.dir)
	}
	r.Detail = fmt.Sprintf("cgroup v1 (%s) memory %s, %s%s", s.mode, display(root, dir), cpuDetail, s.suffix())

	if err := readMemory(&r, cur, peak, stat, "total_inactive_file", func() string { return "no " + peak.path() }); err != nil {
		return source.Reading{}, err
	}

	switch {
	case s.cpuacct == nil:
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "no cpuacct hierarchy: " + s.cpuacctErr.Error()})
	case cpu == nil && loc.cpuWhy != "":
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: loc.cpuWhy})
	case cpu == nil:
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "the sentry is in no cpuacct cgroup"})
	default:
		ns, err := reqUint(cpu)
		switch {
		case err == nil:
			usec := ns / 1000
			r.CPUUsageUsec = &usec
		case errors.Is(err, source.ErrNotMeasurable):
			// The memory cgroup is there but the cpuacct one is not.
			r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: err.Error()})
		default:
			return source.Reading{}, err
		}
	}
	var tasks *fileReq
	if sig.pidsCur != nil && loc.aux.Pids.Path == dir {
		tasks = sig.pidsCur
	}
	if err := s.v1Procs(&r, pr, tasks); err != nil {
		return source.Reading{}, err
	}
	if err := sig.fill(&r, s.pageSize); err != nil {
		return source.Reading{}, err
	}
	return r, nil
}

// v1Procs fills sandbox_processes on cgroup v1, whose cgroup.procs lists only
// the processes of the reader's pid namespace: from a pod without hostPID a
// live sandbox's list reads empty. tasks is pids.current of the same cgroup
// (nil when the pids hierarchy has no cgroup at that path); the pids
// controller counts every task whatever its pid namespace, so it tells a
// dead sandbox (0) from hidden processes. pr is nil when s.pidsHidden.
func (s *cgroupSource) v1Procs(r *source.Reading, pr, tasks *fileReq) error {
	n, known := uint64(0), false
	if tasks != nil && tasks.err == nil {
		if v, err := parseSingleUint(tasks.b); err == nil {
			n, known = v, true // a malformed file fails the sample in fillPids
		}
	}
	hidden := "statsd runs in a pid namespace of its own (not the host's, whose /proc is at " + s.procRoot +
		"), and cgroup v1's cgroup.procs lists no process outside it"
	if s.pidsHidden {
		if known && n == 0 {
			zero := uint32(0)
			r.SandboxProcesses = &zero
			return nil
		}
		if known {
			hidden += fmt.Sprintf(" (%s is %d)", tasks.path(), n)
		}
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_processes", Reason: hidden})
		return nil
	}
	// On the host's pid namespace cgroup.procs is the truth: pids.current
	// may still count a dead sandbox's tasks until their parent reaps them
	// (a cgroup's exited tasks leave cgroup.procs at once but are
	// uncharged from pids.current only when released), so it must not turn
	// a dead sandbox's empty list into an absent count.
	return procs(r, pr)
}

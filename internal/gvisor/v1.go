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
	cur, peak, stat, pr := req("memory.usage_in_bytes"), req("memory.max_usage_in_bytes"), req("memory.stat"), req("cgroup.procs")
	reqs := []*fileReq{cur, peak, stat, pr}
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

	if err := readMemory(&r, cur, peak, stat, "total_inactive_file", "no "+peak.path()); err != nil {
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
	if s.pidsHidden {
		// cgroup v1 leaves out of cgroup.procs every process outside the
		// reader's pid namespace: the count would be 0 for a live sandbox.
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_processes", Reason: "statsd runs in a pid namespace of its own (not the host's, whose /proc is at " +
			s.procRoot + "), and cgroup v1's cgroup.procs lists no process outside it"})
	} else if err := procs(&r, pr); err != nil {
		return source.Reading{}, err
	}
	if err := sig.fill(&r, s.pageSize); err != nil {
		return source.Reading{}, err
	}
	return r, nil
}

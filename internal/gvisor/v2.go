// This file reads a cgroup v2 (unified) sandbox cgroup.

package gvisor

import (
	"context"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// readV2 reads memory.current (required), memory.peak (optional, Linux 5.19+),
// memory.stat inactive_file, cpu.stat usage_usec and cgroup.procs, and the
// signal and block IO files (signals_v2.go).
func (s *cgroupSource) readV2(ctx context.Context, loc *location) (source.Reading, error) {
	root, dir := s.unified, loc.mem
	req := func(name string) *fileReq { return &fileReq{root: root, dir: dir, name: name} }
	cur, peak, stat, cpu, pr := req("memory.current"), req("memory.peak"), req("memory.stat"), req("cpu.stat"), req("cgroup.procs")
	sig := newV2Signals(req)
	s.readAll(ctx, append([]*fileReq{cur, peak, stat, cpu, pr}, sig.reqs()...))

	r := source.Reading{
		Kind:   source.KindCgroup,
		Detail: "cgroup v2 (unified) " + display(root, dir) + s.suffix(),
	}
	if err := readMemory(&r, cur, peak, stat, "inactive_file", func() string {
		return "memory.peak not offered by this kernel (needs Linux 5.19): no " + peak.path()
	}); err != nil {
		return source.Reading{}, err
	}
	usec, ok, err := optKeyed(cpu, "usage_usec")
	if err != nil {
		return source.Reading{}, err
	}
	if ok {
		r.CPUUsageUsec = &usec
	} else {
		r.Absent = append(r.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "no usage_usec in " + cpu.path()})
	}
	if err := procs(&r, pr); err != nil {
		return source.Reading{}, err
	}
	if err := sig.fill(&r, cpu); err != nil {
		return source.Reading{}, err
	}
	return r, nil
}

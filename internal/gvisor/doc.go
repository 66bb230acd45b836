// Package gvisor measures a gVisor (runsc) sandbox through the host cgroup
// that holds its sentry, gofers and platform stubs, on cgroup v2 (unified),
// v1 (legacy) and hybrid hosts.
//
// The host cgroup is the only place the whole sandbox is accounted: the
// sentry's own accounting (runsc events) misses the sandbox runtime, and the
// per-container cgroups runsc creates for tools like cAdvisor hold no process.
// The cgroup is named by the launcher, either as a path relative to the
// cgroup mount or as the sentry's host pid, resolved through
// /proc/<pid>/cgroup at Open (or at the first Sample, when the sentry was
// not there yet), pinned by the sentry's start time, and re-resolved when
// the cgroup disappears; a sentry that dies leaves its cgroup, which is
// still read.
//
// A Sample reads four files (v2: memory.current, memory.peak, memory.stat,
// cpu.stat; v1: memory.usage_in_bytes, memory.max_usage_in_bytes, memory.stat
// in the memory hierarchy and cpuacct.usage in the cpuacct hierarchy) plus
// cgroup.procs, and the signal and traffic files: on v2 memory.max,
// memory.high, memory.events, cpu.max, cpu/memory/io.pressure, pids.current,
// pids.max and io.stat in the same cgroup (cpu.stat gives the throttling
// counters); on v1 memory.limit_in_bytes and memory.oom_control, the cpu
// hierarchy's cpu.stat, cpu.cfs_quota_us and cpu.cfs_period_us, the pids
// hierarchy's pids.current and pids.max, the blkio hierarchy's
// blkio.throttle.io_service_bytes and io_serviced (and its root's
// io_service_bytes, which tells whether the kernel counts block IO at all),
// and on a hybrid host the pressure files of the sandbox's unified cgroup.
// Bound by sentry pid it also reads /proc/<pid>/net/dev under the sentry's
// start-time pin. Every read goes through internal/bounded, every cgroup
// file through an os.Root on its hierarchy, so that no path escapes the
// cgroup mount; the files of one Sample are read concurrently. A missing
// optional file, hierarchy or path leaves its part absent with the reason,
// never 0. Nothing is ever written to a cgroup. docs/signals.md says which
// file gives which field.
//
// The files, one job each: source.go (Config, Open, Sample, Close),
// sentry.go (a sentry pid to its cgroup, pinned by start time), mount.go
// (where each cgroup mount is rooted in this process's cgroup namespace, from
// /proc/self/mountinfo), location.go (which cgroup paths to read), dircache.go (the open directory handles),
// hierarchies.go (the v1 cpu, pids, blkio and hybrid unified mounts),
// files.go (the per-file reads of a Sample), memory.go, v1.go and v2.go (the
// readers), signals.go, signals_v1.go, signals_v2.go and blkio_v1.go (the
// signal and block IO parts), network.go (the sentry's net/dev), parse.go,
// parse_signals.go, parse_traffic.go and parse_mountinfo.go (the pure parsers
// of kernel text)
// and mode*.go (the host's cgroup layout).
//
//	src, err := gvisor.Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: pid},
//		gvisor.Config{CgroupRoot: "/sys/fs/cgroup", ProcRoot: "/proc", ReadTimeout: 2 * time.Second})
//	if err != nil { ... }
//	defer src.Close()
//	r, err := src.Sample(ctx)
package gvisor

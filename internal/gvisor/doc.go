// Package gvisor measures a gVisor (runsc) sandbox through the host cgroup
// that holds its sentry, gofers and platform stubs, on cgroup v2 (unified),
// v1 (legacy) and hybrid hosts.
//
// The host cgroup is the only place the whole sandbox is accounted: the
// sentry's own accounting (runsc events) misses the sandbox runtime, and the
// per-container cgroups runsc creates for tools like cAdvisor hold no process.
// The cgroup is named by the launcher, either as a path relative to the
// cgroup mount or as the sentry's host pid, resolved through
// /proc/<pid>/cgroup and re-resolved when the cgroup disappears.
//
// A Sample reads four files (v2: memory.current, memory.peak, memory.stat,
// cpu.stat; v1: memory.usage_in_bytes, memory.max_usage_in_bytes, memory.stat
// in the memory hierarchy and cpuacct.usage in the cpuacct hierarchy) plus
// cgroup.procs, each through internal/bounded, opened through an os.Root so
// that no path escapes the cgroup mount. Nothing is ever written to a cgroup.
//
// The files, one job each: source.go (Config, Open, Sample, Close),
// sentry.go (a sentry pid to its cgroup, pinned by start time), location.go
// (which cgroup paths to read), dircache.go (the open directory handles),
// files.go (the per-file reads of a Sample), memory.go, v1.go and v2.go (the
// readers), parse.go (the pure parsers of kernel text) and mode*.go (the
// host's cgroup layout).
//
//	src, err := gvisor.Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: pid},
//		gvisor.Config{CgroupRoot: "/sys/fs/cgroup", ProcRoot: "/proc", ReadTimeout: 2 * time.Second})
//	if err != nil { ... }
//	defer src.Close()
//	r, err := src.Sample(ctx)
package gvisor

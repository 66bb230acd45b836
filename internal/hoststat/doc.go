// Package hoststat reads the runner-layer (host) views of one sandbox, for
// statsd's include_host and StatsHost reads:
//
//   - the runner kernel's /proc/stat CPU columns, in usec;
//   - the VMM's threads (or a gVisor sandbox's processes, as
//     Config.SandboxProcesses lists them) as the host scheduler accounted
//     them, split into vCPU and other threads;
//   - KVM counters from the VMM's debugfs per-VM directory and from QEMU QMP
//     query-stats, each tagged cumulative, gauge or peak.
//
// A sample is a source.HostStats, served to every caller for
// Config.MinInterval (cache.go). The VMM (or sentry) is pinned at its first
// sample, so a reused pid is never read as it; a QMP session is bounded in
// bytes, events and time (qmpconn.go). Each view carries a legend that keeps
// it from being misread and its own shortfall, so one failing view never
// loses the others. Every read runs under internal/bounded with Config.ReadTimeout;
// /proc is parsed by internal/process (a thread's files read as a process's).
//
//	s, err := hoststat.Open(ref, hoststat.Config{ProcRoot: "/proc", DebugfsRoot: "/sys/kernel/debug"})
//	before, _ := s.SampleHost(ctx)
//	time.Sleep(10 * time.Second)
//	after, _ := s.SampleHost(ctx)
//	// difference per thread (same tid and start time) and per cumulative
//	// KVM counter; never the class totals, gauges or peaks
package hoststat

// Package hoststat reads the runner-layer (host) views of one sandbox, for
// statsd's include_host and StatsHost reads and for statsctl host:
//
//   - the runner kernel's /proc/stat CPU columns, in usec;
//   - the VMM's threads (or a gVisor sandbox's processes) as the host
//     scheduler accounted them, split into vCPU and other threads;
//   - KVM counters from the VMM's debugfs per-VM directory and from QEMU QMP
//     query-stats, each tagged cumulative, gauge or peak.
//
// Each view carries a legend that keeps it from being misread and its own
// shortfall, so one failing view never loses the others. Every read runs
// under internal/bounded with Config.ReadTimeout.
//
// Window turns two samples into differences and rates of cumulative counters
// only; WriteSampleTable and WriteWindowTable print them with units and
// legends.
//
//	s, err := hoststat.Open(ref, hoststat.Config{ProcRoot: "/proc", DebugfsRoot: "/sys/kernel/debug"})
//	before, _ := s.SampleHost(ctx)
//	time.Sleep(10 * time.Second)
//	after, _ := s.SampleHost(ctx)
//	hoststat.WriteWindowTable(os.Stdout, hoststat.Window(before, after, 10*time.Second))
package hoststat

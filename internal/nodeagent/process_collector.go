package nodeagent

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
)

// procRoot is where procfs is mounted: the agent's own process metrics
// read <procRoot>/self.
const procRoot = "/proc"

// processCollector exports the agent's own process_* metrics under
// client_golang's process collector's names, help texts and meanings
// (collectors.NewProcessCollector), gathered at every scrape. What it
// reads differs (issue 33: client_golang's was a quarter of an idle
// scrape's CPU):
//   - the start time is read once: client_golang reads /proc/stat again at
//     every scrape for the boot time, a constant;
//   - the limits (process_max_fds, process_virtual_memory_max_bytes) come
//     from getrlimit(2), the soft limits /proc/<pid>/limits shows, without
//     the file and its parse;
//   - process_network_receive_bytes_total and
//     process_network_transmit_bytes_total are not exported: they are
//     /proc/<pid>/net/netstat's IpExt octets, the whole network
//     namespace's traffic (the node's, with hostNetwork), not the
//     process's, and reading them was the costliest part of a scrape's
//     process metrics (docs/statsagent.md, "Metrics").
//
// Like client_golang's without ReportErrors, a figure that cannot be read
// is left out of the scrape.
type processCollector struct {
	dir string // <proc root>/self
	// fdSize: the root is a procfs, whose fd directories give their
	// entries' count as their size (Linux 6.2 and later; 0 before).
	fdSize bool

	// bootTime is when the machine booted, whole seconds since the epoch,
	// as /proc/stat's btime: on a procfs root from the clocks (REALTIME
	// less BOOTTIME, as the kernel computes btime: no file read, and a
	// wall-clock step, as the first NTP sync after boot, is followed at
	// the next scrape), else from <root>/stat each scrape.
	bootTime func() (uint64, error)

	cpu, openFDs, maxFDs, vsize, maxVsize, rss, startTime *prometheus.Desc
}

// newProcessCollector returns the collector of the process /proc shows
// under procRoot as self.
func newProcessCollector(procRoot string) *processCollector {
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	var fs syscall.Statfs_t
	isProc := syscall.Statfs(procRoot, &fs) == nil && fs.Type == procSuperMagic
	bootTime := clockBootTime
	if !isProc {
		stat := filepath.Join(procRoot, "stat")
		bootTime = func() (uint64, error) {
			b, err := bounded.ReadFile(stat, bounded.MaxFileBytes)
			if err != nil {
				return 0, err
			}
			return process.ParseBootTime(b)
		}
	}
	return &processCollector{
		dir:       filepath.Join(procRoot, "self"),
		fdSize:    isProc,
		bootTime:  bootTime,
		cpu:       desc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."),
		openFDs:   desc("process_open_fds", "Number of open file descriptors."),
		maxFDs:    desc("process_max_fds", "Maximum number of open file descriptors."),
		vsize:     desc("process_virtual_memory_bytes", "Virtual memory size in bytes."),
		maxVsize:  desc("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes."),
		rss:       desc("process_resident_memory_bytes", "Resident memory size in bytes."),
		startTime: desc("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
	}
}

// Describe implements prometheus.Collector.
func (c *processCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.openFDs, c.maxFDs, c.vsize, c.maxVsize, c.rss, c.startTime} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *processCollector) Collect(ch chan<- prometheus.Metric) {
	if st, err := process.ReadStat(c.dir); err == nil {
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, float64(st.UTime+st.STime)/process.UserHZ)
		ch <- prometheus.MustNewConstMetric(c.vsize, prometheus.GaugeValue, float64(st.VSize))
		ch <- prometheus.MustNewConstMetric(c.rss, prometheus.GaugeValue, float64(st.RSS)*float64(os.Getpagesize()))
		if start, err := c.startSeconds(st.Starttime); err == nil {
			ch <- prometheus.MustNewConstMetric(c.startTime, prometheus.GaugeValue, start)
		}
	}
	if n, err := countFDs(filepath.Join(c.dir, "fd"), c.fdSize); err == nil {
		ch <- prometheus.MustNewConstMetric(c.openFDs, prometheus.GaugeValue, float64(n))
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		ch <- prometheus.MustNewConstMetric(c.maxFDs, prometheus.GaugeValue, float64(lim.Cur))
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &lim); err == nil {
		ch <- prometheus.MustNewConstMetric(c.maxVsize, prometheus.GaugeValue, float64(lim.Cur))
	}
}

// startSeconds is the process's start time since the epoch: the boot
// time plus starttime, the clock ticks from boot to the process's start.
func (c *processCollector) startSeconds(starttime uint64) (float64, error) {
	boot, err := c.bootTime()
	if err != nil {
		return 0, err
	}
	return float64(boot) + float64(starttime)/process.UserHZ, nil
}

// procSuperMagic is procfs's statfs f_type (PROC_SUPER_MAGIC).
const procSuperMagic = 0x9fa0

// countFDs counts the entries of a /proc/<pid>/fd directory: with fdSize,
// its size where the kernel gives it (Linux 6.2 and later), else its
// names (as client_golang's procfs does).
func countFDs(dir string, fdSize bool) (int, error) {
	if fdSize {
		if fi, err := os.Stat(dir); err != nil {
			return 0, err
		} else if fi.Size() > 0 {
			return int(fi.Size()), nil
		}
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return len(names), err
}

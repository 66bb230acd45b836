package nodeagent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// counterMetric is the Prometheus counter one rate.Counter is exported as.
type counterMetric struct {
	name, help string
	// scale turns the counter's unit into the metric's (µs into seconds).
	scale float64
}

const chargedLikeCPU = " Charged by activation like CPU: its head from the epoch start, its tail from the ended record's final sample, once (see docs/statsagent.md); never decreases."

func network(dir, what, field string) counterMetric {
	verb := map[string]string{"receive": "received", "transmit": "transmitted"}[dir]
	return counterMetric{
		name:  "sandboxstats_workload_network_" + dir + "_" + what + "_total",
		help:  "Network " + field + " " + verb + " by the sandboxes (counter, " + field + ", layer: the sentry's network namespace for the cgroup source, the guest for the guest agent), summed over the interfaces but loopback (per interface with --label-interface)." + chargedLikeCPU,
		scale: 1,
	}
}

// counterMetrics names the export of every counter the Accountant charges.
var counterMetrics = [rate.NumCounters]counterMetric{
	rate.CounterCPU: {metricCPUSeconds,
		"CPU time charged to workloads with these labels (counter, seconds, layer: source), each activation from its first to its last microsecond: its head from the epoch start, its tail from the ended record's final sample, once (see docs/statsagent.md). Never decreases.", 1e-6},
	rate.CounterThrottledUsec: {"sandboxstats_workload_cpu_throttled_seconds_total",
		"Time the CFS bandwidth quota kept the workloads from running (counter, seconds, layer: source: cpu.stat throttled_usec, v1 throttled_time)." + chargedLikeCPU, 1e-6},
	rate.CounterPeriods: {"sandboxstats_workload_cpu_periods_total",
		"CFS bandwidth periods that elapsed with the workloads runnable (counter, periods, layer: source: cpu.stat nr_periods)." + chargedLikeCPU, 1},
	rate.CounterThrottledPeriods: {"sandboxstats_workload_cpu_throttled_periods_total",
		"CFS bandwidth periods in which the workloads' quota ran out (counter, periods, layer: source: cpu.stat nr_throttled)." + chargedLikeCPU, 1},
	rate.CounterPressureCPUSome: {"sandboxstats_workload_pressure_cpu_waiting_seconds_total",
		"Time in which some of the workloads' tasks waited for CPU (counter, seconds, layer: sandbox cgroup: PSI cpu.pressure some total)." + chargedLikeCPU, 1e-6},
	rate.CounterPressureCPUFull: {"sandboxstats_workload_pressure_cpu_stalled_seconds_total",
		"Time in which all the workloads' non-idle tasks stalled on CPU (counter, seconds, layer: sandbox cgroup: PSI cpu.pressure full total)." + chargedLikeCPU, 1e-6},
	rate.CounterPressureMemSome: {"sandboxstats_workload_pressure_memory_waiting_seconds_total",
		"Time in which some of the workloads' tasks waited for memory (counter, seconds, layer: sandbox cgroup: PSI memory.pressure some total)." + chargedLikeCPU, 1e-6},
	rate.CounterPressureMemFull: {"sandboxstats_workload_pressure_memory_stalled_seconds_total",
		"Time in which all the workloads' non-idle tasks stalled on memory (counter, seconds, layer: sandbox cgroup: PSI memory.pressure full total)." + chargedLikeCPU, 1e-6},
	rate.CounterPressureIOSome: {"sandboxstats_workload_pressure_io_waiting_seconds_total",
		"Time in which some of the workloads' tasks waited for IO (counter, seconds, layer: sandbox cgroup: PSI io.pressure some total)." + chargedLikeCPU, 1e-6},
	rate.CounterPressureIOFull: {"sandboxstats_workload_pressure_io_stalled_seconds_total",
		"Time in which all the workloads' non-idle tasks stalled on IO (counter, seconds, layer: sandbox cgroup: PSI io.pressure full total)." + chargedLikeCPU, 1e-6},
	rate.CounterOOMKills: {"sandboxstats_workload_oom_kills_total",
		"Processes the kernel's OOM killer killed in the sandboxes (counter, kills, layer: source: v2 memory.events oom_kill, v1 memory.oom_control oom_kill; the guest agent offers none)." + chargedLikeCPU, 1},
	rate.CounterNetRxBytes:   network("receive", "bytes", "bytes"),
	rate.CounterNetRxPackets: network("receive", "packets", "packets"),
	rate.CounterNetRxErrors:  network("receive", "errors", "errors"),
	rate.CounterNetRxDropped: network("receive", "dropped", "drops"),
	rate.CounterNetTxBytes:   network("transmit", "bytes", "bytes"),
	rate.CounterNetTxPackets: network("transmit", "packets", "packets"),
	rate.CounterNetTxErrors:  network("transmit", "errors", "errors"),
	rate.CounterNetTxDropped: network("transmit", "dropped", "drops"),
	rate.CounterIOReadBytes: {"sandboxstats_workload_io_read_bytes_total",
		"Bytes read from block devices that the kernel charged to the sandboxes (counter, bytes, layer: source: v2 io.stat rbytes, v1 blkio.throttle.io_service_bytes; only IO the kernel accounts, see docs/signals.md)." + chargedLikeCPU, 1},
	rate.CounterIOWriteBytes: {"sandboxstats_workload_io_write_bytes_total",
		"Bytes written to block devices that the kernel charged to the sandboxes (counter, bytes, layer: source: v2 io.stat wbytes, v1 blkio.throttle.io_service_bytes; only IO the kernel accounts, see docs/signals.md)." + chargedLikeCPU, 1},
	rate.CounterIOReadOps: {"sandboxstats_workload_io_read_operations_total",
		"Block device reads that the kernel charged to the sandboxes (counter, operations, layer: source: v2 io.stat rios, v1 blkio.throttle.io_serviced)." + chargedLikeCPU, 1},
	rate.CounterIOWriteOps: {"sandboxstats_workload_io_write_operations_total",
		"Block device writes that the kernel charged to the sandboxes (counter, operations, layer: source: v2 io.stat wios, v1 blkio.throttle.io_serviced)." + chargedLikeCPU, 1},
	rate.CounterSandboxOwnCPU: {metricSandboxOwnCPU,
		"The sandboxes' own share of " + metricCPUSeconds + ", what the isolation costs (counter, seconds, layer: sandbox runtime, gVisor only: the host CPU of the sentry and the gofers plus the pause container's part); the containers' CPU (" + metricContainerCPU + ") plus this is the pod's. Absent where the source offers none (Kata, runsc's kvm platform, without statsd's --runsc-root)." + chargedLikeCPU, 1e-6},
}

// counterDescs returns the descriptors of the counter metrics: with the
// workload labels, and for the network counters with LabelInterface the
// interface label too.
func counterDescs(labels []string, perInterface bool) [rate.NumCounters]*prometheus.Desc {
	var out [rate.NumCounters]*prometheus.Desc
	for c, cm := range counterMetrics {
		ls := labels
		if perInterface && rate.Counter(c).IsNetwork() {
			ls = append(labels[:len(labels):len(labels)], "interface")
		}
		out[c] = prometheus.NewDesc(cm.name, cm.help, ls, nil)
	}
	return out
}

// Package rate turns successive WorkloadStatsSamples into what a person or a
// monitoring system can use: CPU cores used over an interval (for
// `statsctl watch`) and a CPU-seconds counter that never decreases across
// epochs (for statsagent's Prometheus export).
//
// It computes, it does not print: `statsctl watch` renders Rows. It is pure:
// no clocks, no I/O. The rules
// it enforces are those of the API (proto/sandboxstats/v1/stats.proto):
//
//   - cpu_usage_usec is a counter within one epoch (epoch_unix_nano). Two
//     samples give a rate only when they have the same actor, the same source
//     and the same epoch, the counter did not decrease, and observed_at moved
//     forward. Otherwise the step is marked (epoch reset, counter reset, no
//     interval) and no rate is printed, never a negative one.
//   - Memory current, working set and peak are gauges (peak within the
//     epoch): they are reported as read, never differenced.
//   - A sample whose source is UNSPECIFIED was not measured: its numbers are
//     meaningless and are shown as absent, not zero.
//   - Samples of different sources measure different layers: they are never
//     compared or summed.
package rate

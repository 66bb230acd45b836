// Package rate turns successive samples into what a person or a monitoring
// system can use: CPU cores used over an interval (Watcher, for
// `statsctl watch`), counters that never decrease across epochs, one per
// counter of a sample (CPU, OOM kills, throttling, pressure, network, block
// IO: Accountant, for statsagent's Prometheus export), and the
// differences and rates of a sandbox's host counters over a window (Window,
// for `statsctl host --window`).
//
// It works on the API's wire types (proto/sandboxstats/v1) on the client
// side, and it computes, it does not print: statsctl renders what it
// returns. It is pure: no clocks, no I/O. The rules it enforces are those of
// the API (proto/sandboxstats/v1/stats.proto and host.proto):
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
//   - Of the host counters only cumulative ones are differenced; a decrease,
//     a thread that came or went, a VM replaced or a view short in either
//     sample is a finding, never a rate.
package rate

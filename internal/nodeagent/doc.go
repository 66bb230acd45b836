// Package agent is the node agent behind cmd/statsagent and `statsctl poll`:
// it discovers every statsd on a node from a socket glob, polls each with
// StatsActiveWorkloads under a per-call timeout and a concurrency limit
// (Sweep), and exports the latest sweep as Prometheus metrics (Metrics),
// turning each workload's per-epoch CPU counter into a CPU-seconds counter
// that never decreases (internal/rate).
//
// Discovery is stateless: every sweep globs again, so a daemon that appears
// is polled at the next sweep and one that vanished is simply not found. A
// daemon that does not answer costs only its own timeout.
package nodeagent

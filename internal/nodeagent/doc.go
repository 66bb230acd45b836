// Package nodeagent is the node agent behind cmd/statsagent: on a timer it
// sweeps every statsd on the node (internal/sweep) and exports the latest
// sweep as Prometheus metrics (metrics), turning each workload's per-epoch
// CPU counter into a CPU-seconds counter that never decreases
// (internal/rate). It serves /metrics and /healthz (Agent.Handler).
package nodeagent

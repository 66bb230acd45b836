// Package sweep polls every statsd on a node once: it discovers the daemons
// from a socket glob (Discover), calls StatsActiveWorkloads on each under a
// per-call timeout and a concurrency limit (Sweep, PollAll), reads every
// page of its ended activations (ListEnded; bounded by Limits), lists the
// open drift findings of a daemon whose answer says drift may explain it, and
// classifies each outcome (DaemonResult: ok, no sample, error, vanished).
//
// It is the client side shared by `statsctl poll`, `statsctl activations`
// and the node agent
// (internal/nodeagent, which turns sweeps into Prometheus metrics). It
// depends on the API and gRPC only: no metrics, no daemon internals.
//
// Discovery is stateless: every sweep globs again, so a daemon that appears
// is polled at the next sweep and one that vanished is simply not found. A
// daemon that does not answer costs only its own timeout. Config's polls
// dial each daemon afresh (statsctl poll); a Pool keeps one connection per
// daemon across sweeps (the node agent), under the same checks and bounds.
package sweep

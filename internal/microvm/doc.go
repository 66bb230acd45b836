// Package microvm measures a Kata-style micro-VM through its guest agent:
// ttrpc StatsContainer calls over hybrid vsock (a Unix socket plus a
// "CONNECT <port>" handshake, for Cloud Hypervisor and Firecracker) or vsock
// (QEMU), summed over the workload's containers.
//
// Open returns a source.Source that keeps one ttrpc connection to the agent
// across polls, reconnects with a capped backoff after a failure, bounds every
// call, and converts the agent's payload (nanoseconds, raw memory.stat of a
// cgroup v1 or v2 guest) into the units of the API: CPU in microseconds,
// working set without inactive file pages, unlimited limits recognised. It
// corrects the CPU unit of agents older than 3.9.0 on cgroup v2 guests.
//
// The wire subset of the agent's protocol lives in proto/kata/grpc; the
// services are called by name over ttrpc. Tests use the fake agent in
// internal/kataagentfake and never touch AF_VSOCK.
package microvm

// Package microvm measures a Kata-style micro-VM through its guest agent:
// ttrpc StatsContainer calls over hybrid vsock (a Unix socket plus a
// "CONNECT <port>" handshake, for Cloud Hypervisor and Firecracker) or vsock
// (QEMU), summed over the workload's containers.
//
// Open returns a source.Source that keeps one ttrpc connection to the agent
// across polls, reconnects with a capped backoff after a failure, bounds every
// call, guards the connection frame by frame (guard.go: a frame over 256 KiB
// or for a stream with no request outstanding cuts it, and so do three
// unanswered calls in a row), counts what a reply holds before anything
// decodes it (replybudget.go: fields, messages and map entries; over the
// budget it is refused undecoded), cuts and quotes whatever text the guest sends
// where it enters, and converts the agent's payload (nanoseconds, raw memory.stat of a
// cgroup v1 or v2 guest) into the units of the API: CPU in microseconds,
// working set without inactive file pages, unlimited limits recognised. It
// corrects the CPU unit of agents older than 3.9.0 on cgroup v2 guests.
//
// Besides memory and CPU it reports the signals StatsContainer carries
// (convert_signals.go, summed in aggregate_signals.go): the memory limit,
// CFS throttling periods and time, pids and their limit, the guest's
// network_stats (each interface once, not once per container) and block IO
// per device. What the reply does not carry is absent with a reason, never
// 0: OOM kills (failcnt counts limit hits, not kills; GetOOMEvent belongs to
// the shim and is never called), memory.high, the CFS quota, pressure, the
// throttled time of a cgroup v2 guest whose agent predates the kata issue
// 13851 fix, and network_stats, which the Rust agent never fills. A partial
// sample carries no counter. docs/microvm.md has the field table.
//
// The wire subset of the agent's protocol lives in proto/kata/grpc; the
// services are called by name over ttrpc and nothing but StatsContainer and
// Health.Version is ever called. Tests use the fake agent in
// internal/kataagentfake and never touch AF_VSOCK on the host; one,
// TestIntegrationVsockLoopback, dials the vsock loopback inside the VM
// lane's guest only.
package microvm

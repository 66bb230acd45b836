// Package drift notices when what statsd was told (the bound identity and its
// SandboxRef) no longer matches what runs: a dead sandbox, a vanished cgroup
// or sentry, a silent guest agent, a container the agent does not know, a VMM
// that exited, a stray VMM claiming this guest.
//
// Each kind of drift is reported once (one WARN log line and one event),
// never repeated while it lasts, and cleared once with an INFO "matches
// again" event when it is undone. When one side cannot be read, only the
// comparisons that side is needed for are skipped and their findings are kept
// as they are, neither cleared nor re-reported. A workload in the middle of a
// lifecycle call is skipped, and so is one younger than the grace period.
// Findings are persisted beside the identity, so a restarted statsd neither
// re-reports nor forgets them.
//
// The check only reads: it samples through the bound source (the same
// read-only calls a poll makes) and reads /proc.
package drift

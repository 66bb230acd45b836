package drift

import "fmt"

// Kind is a kind of drift. The numbers are those of the state file and of
// the wire's DriftKind (internal/server converts; a test holds them equal).
type Kind int

const (
	KindUnspecified Kind = iota
	// KindCgroupGone: the sandbox cgroup no longer exists.
	KindCgroupGone
	// KindSandboxDead: the cgroup is there but holds no process.
	KindSandboxDead
	// KindSentryGone: the sentry the ref names by pid exited.
	KindSentryGone
	// KindSentryMoved: the sentry's cgroups changed.
	KindSentryMoved
	// KindAgentSilent: the guest agent has not answered past the grace.
	KindAgentSilent
	// KindContainerUnknown: the agent does not know a container id.
	KindContainerUnknown
	// KindVMMGone: the VMM the ref names exited.
	KindVMMGone
	// KindStrayVMM: another VMM process claims the bound guest's name.
	KindStrayVMM
	// KindOOMKilled: the sandbox is dead and its OOM kill count rose in the
	// epoch.
	KindOOMKilled
)

var kindNames = [...]string{
	KindUnspecified:      "UNSPECIFIED",
	KindCgroupGone:       "CGROUP_GONE",
	KindSandboxDead:      "SANDBOX_DEAD",
	KindSentryGone:       "SENTRY_GONE",
	KindSentryMoved:      "SENTRY_MOVED",
	KindAgentSilent:      "AGENT_SILENT",
	KindContainerUnknown: "CONTAINER_UNKNOWN",
	KindVMMGone:          "VMM_GONE",
	KindStrayVMM:         "STRAY_VMM",
	KindOOMKilled:        "OOM_KILLED",
}

// String is the kind's name in statsd's logs, event messages and finding
// keys ("SANDBOX_DEAD"), the same words statsctl prints from the wire's
// DriftKind (api.DriftKindName; statsctl does not link drift); a kind this
// build does not know (a newer state file's) is "KIND(n)".
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("KIND(%d)", int(k))
}

// Dead reports whether a finding of kind k says the sandbox is dead: no
// process left in it (SANDBOX_DEAD, OOM_KILLED), its cgroup gone
// (CGROUP_GONE), the sentry or the VMM it was bound by exited (SENTRY_GONE,
// VMM_GONE). A silent agent, an unknown container, a moved sentry or a
// stray VMM does not: the sandbox may run on.
func (k Kind) Dead() bool {
	switch k {
	case KindSandboxDead, KindOOMKilled, KindCgroupGone, KindSentryGone, KindVMMGone:
		return true
	default:
		return false
	}
}

// EventType says what an event did to a finding. Numbered like the wire's
// DriftEventType.
type EventType int

const (
	EventUnspecified EventType = iota
	EventOpened
	EventCleared
	EventDropped
)

// String is the event type's name ("OPENED").
func (t EventType) String() string {
	switch t {
	case EventOpened:
		return "OPENED"
	case EventCleared:
		return "CLEARED"
	case EventDropped:
		return "DROPPED"
	default:
		return fmt.Sprintf("EVENT(%d)", int(t))
	}
}

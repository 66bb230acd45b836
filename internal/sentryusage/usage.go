package sentryusage

import (
	"errors"
	"fmt"
)

// Method is the one urpc method this package sends: runsc's
// boot.ContMgrEvent, what `runsc events` calls. It is a constant and no
// function takes a method name: no other method can be sent.
const Method = "containerManager.Event"

// Sentinels. Every error of Read wraps exactly one of them (and the cause,
// with a second %w where there is one) and names the socket and the
// container asked about.
var (
	// ErrBadID: a sandbox or container id runsc itself would refuse
	// (runsc's validateID: [A-Za-z0-9_+.-], here also at most MaxIDBytes).
	ErrBadID = errors.New("sentryusage: not a runsc id")
	// ErrNoSocket: no control socket for the sandbox in any layout tried
	// (the sandbox is gone, or runs under another root).
	ErrNoSocket = errors.New("sentryusage: no control socket")
	// ErrIO: the socket was found but the call failed on the wire (refused,
	// reset, closed before a whole reply); the deadline is ErrDeadline.
	ErrIO = errors.New("sentryusage: control socket I/O")
	// ErrDeadline: no whole reply before the deadline (a hung or slow
	// sentry) or the context was done.
	ErrDeadline = errors.New("sentryusage: deadline")
	// ErrTooLarge: the reply went past Config.MaxReplyBytes.
	ErrTooLarge = errors.New("sentryusage: reply too large")
	// ErrMalformed: the reply is not an EventOut as runsc writes it.
	ErrMalformed = errors.New("sentryusage: malformed reply")
	// ErrRemote: the sentry answered with an error (success false).
	ErrRemote = errors.New("sentryusage: the sentry answered an error")
	// ErrWrongContainer: the reply is about another container than the one
	// asked about.
	ErrWrongContainer = errors.New("sentryusage: reply names another container")
)

// MaxIDBytes is the longest sandbox or container id Read accepts: CRI ids
// are 64 hex digits.
const MaxIDBytes = 128

// MaxContainers is the most containers one reply may name: a pod has a
// handful; more is a lying sentry.
const MaxContainers = 256

// Dialect is how Event's argument is spelt, which also says what memory and
// pids mean. The client learns it per sandbox on the first call.
type Dialect int

const (
	// DialectUnknown: not yet learnt.
	DialectUnknown Dialect = iota
	// DialectNoArg: runsc before release-20230731 (gVisor a5fd5015):
	// Event(*struct{}), the request's arg is null and the reply is the
	// same for every container of the sandbox (memory the sandbox's total,
	// pids the sandbox's thread groups).
	DialectNoArg
	// DialectContainerID: release-20230731 and later: Event(*string), the
	// arg is the container id; memory and pids are that container's.
	DialectContainerID
)

func (d Dialect) String() string {
	switch d {
	case DialectNoArg:
		return "no-arg"
	case DialectContainerID:
		return "container-id"
	}
	return "unknown"
}

// MemoryScope says what Usage.MemoryBytes measures.
type MemoryScope int

const (
	// MemoryAbsent: no memory figure in the reply.
	MemoryAbsent MemoryScope = iota
	// MemorySandboxTotal: the sandbox's whole memory (the sentry's
	// MemoryAccounting), given alike for every container: runsc before
	// release-20230731 (DialectNoArg). Not a per-container figure.
	MemorySandboxTotal
	// MemorySplitOrOwn: runsc release-20230731 and later
	// (DialectContainerID): the sandbox's total split evenly over the
	// non-root containers (the root, pause, container gets 0, which runsc
	// omits), or, from release-20231218 (gVisor 54e02c3c) and only for a
	// container whose spec mounts cgroupfs, the container's own gVisor
	// cgroup (memory.usage_in_bytes or memory.current). The reply does not
	// say which: not a per-container figure unless the caller knows the
	// container mounts cgroupfs on such a runsc.
	MemorySplitOrOwn
)

func (m MemoryScope) String() string {
	switch m {
	case MemorySandboxTotal:
		return "sandbox-total"
	case MemorySplitOrOwn:
		return "even-split-or-own"
	}
	return "absent"
}

// Usage is one reply of the sentry, for one container asked about. A nil
// pointer or an empty map is absent, never zero: runsc omits zero values
// (omitempty), so a zero it meant and a figure it lacks read alike, and
// both are absent here.
type Usage struct {
	// Socket is where the reply came from: a path, or @name for an
	// abstract socket (a trailing NUL shown as \x00).
	Socket string
	// Dialect is the argument form the sentry accepted.
	Dialect Dialect

	// CPU is the reply's containerUsage: CPU time in nanoseconds (user plus
	// system, reaped children included) of every container of the sandbox
	// the sentry names, since the container started. It is the sentry's
	// own accounting, in 10 ms ticks on release-20221219, and is not
	// rescaled to the host cgroup: runsc events rescales it (ScaleToHost),
	// because on a busy host the sentry counts time its tasks waited for a
	// CPU (seen at about 2x the host cgroup's with --platform=ptrace).
	// Keys are container ids; from release-20251110, when the sandbox's
	// gVisor cgroups are v1, container names (the CRI container-name
	// annotation). On release-20240109 to release-20251103 it is empty when
	// the asked container has a gVisor cpuacct cgroup; ContainerCPU has its
	// figure then.
	CPU map[string]uint64
	// ContainerCPU is the reply's event.data.cpu.usage.total in
	// nanoseconds: set only by release-20240109 to release-20251103 when
	// the container has a gVisor cpuacct cgroup (cpuacct.usage). nil when
	// absent.
	ContainerCPU *uint64
	// Foreign are keys of containerUsage not among Query.Containers (when
	// the caller gave them): another sandbox's or an invented container,
	// left out of CPU; each cut and escaped (foreign.Text), at most
	// maxForeignKept of them. ForeignCount counts them all.
	Foreign      []string
	ForeignCount int

	// MemoryBytes is event.data.memory.usage.usage in bytes; Memory says
	// what it measures.
	MemoryBytes *uint64
	Memory      MemoryScope
	// Pids is event.data.pids.current: the container's thread groups
	// (DialectContainerID), or the whole sandbox's (DialectNoArg;
	// PidsSandboxWide says so).
	Pids            *uint64
	PidsSandboxWide bool
}

// maxForeignKept is how many foreign keys a Usage keeps by name.
const maxForeignKept = 8

// ScaleToHost returns cpu rescaled so that its values sum to hostNs, each
// container keeping its share: what runsc events prints as
// cpu.usage.total (Container.populateStats, in floating point as runsc
// does, since the product overflows). hostNs is the sandbox's host cgroup
// CPU in nanoseconds (v1 cpuacct.usage, v2 usage_usec x 1000). With no
// sentry CPU at all runsc splits hostNs evenly, and so does ScaleToHost. An
// empty cpu gives nil.
func ScaleToHost(cpu map[string]uint64, hostNs uint64) map[string]uint64 {
	if len(cpu) == 0 {
		return nil
	}
	var all float64 // a float: a lying sentry's values may overflow a uint64 sum
	for _, v := range cpu {
		all += float64(v)
	}
	out := make(map[string]uint64, len(cpu))
	for k, v := range cpu {
		if all == 0 {
			out[k] = hostNs / uint64(len(cpu))
			continue
		}
		out[k] = uint64(float64(v) * (float64(hostNs) / all))
	}
	return out
}

// errorf builds Read's errors: the sentinel, where (socket and container),
// what, and the cause when there is one.
func errorf(sentinel error, socket, container, what string, cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: socket %s, container %q: %s", sentinel, socket, container, what)
	}
	return fmt.Errorf("%w: socket %s, container %q: %s: %w", sentinel, socket, container, what, cause)
}

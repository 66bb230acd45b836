// Package source defines what every measurement source of statsd provides
// (a Source opened for one SandboxRef), the Reading it returns, and the few
// error sentinels that internal/server turns into gRPC codes.
//
// A source knows nothing of gRPC or identity: it reads the sandbox it was
// opened for and says, through the sentinels, why it could not.
package source

import (
	"context"
	"errors"
	"slices"
)

// Sentinels wrapped by every source's errors. internal/server maps them to
// status codes; anything else is INTERNAL.
var (
	// ErrNotMeasurable: the sandbox is bound but cannot be measured yet or
	// right now (cgroup not created yet, agent not answering). UNAVAILABLE.
	ErrNotMeasurable = errors.New("not measurable")
	// ErrTimeout: a bounded read ran out of time. DEADLINE_EXCEEDED.
	ErrTimeout = errors.New("read timed out")
	// ErrMalformed: a kernel file or agent reply could not be parsed; the
	// wrapping error names the path or call and the token. INTERNAL.
	ErrMalformed = errors.New("malformed source")
	// ErrSandboxGone: what the ref names (the sandbox cgroup, the sentry
	// process) no longer exists. Always wrapped together with
	// ErrNotMeasurable, so the server still answers UNAVAILABLE; the drift
	// check tells it apart from "not there yet".
	ErrSandboxGone = errors.New("sandbox gone")
	// ErrAnswered: the peer (a guest agent) answered, with an error. Always
	// wrapped together with another sentinel; the drift check tells an
	// agent that answers errors from a silent one by it.
	ErrAnswered = errors.New("the peer answered with an error")
)

// ReasonUnknownContainer is the ContainerError reason for a container id the
// guest agent does not know.
const ReasonUnknownContainer = "unknown container"

// Class is the kind of sandbox.
type Class int

const (
	ClassUnspecified Class = iota
	ClassGVisor
	ClassMicroVM
)

// String returns the lower-case name used in flags, state files and labels.
func (c Class) String() string {
	switch c {
	case ClassGVisor:
		return "gvisor"
	case ClassMicroVM:
		return "microvm"
	default:
		return "unspecified"
	}
}

// SandboxRef says where to measure a workload. It mirrors
// sandboxstatsv1.SandboxRef; see the proto for each field's rules.
type SandboxRef struct {
	Class Class `json:"class"`
	// gVisor: exactly one of CgroupPath and SentryPID.
	CgroupPath string `json:"cgroup_path,omitempty"`
	SentryPID  int    `json:"sentry_pid,omitempty"`
	// Micro-VM.
	AgentAddress string   `json:"agent_address,omitempty"`
	ContainerIDs []string `json:"container_ids,omitempty"`
	// Containers names the workload's containers (id and name). Micro-VM:
	// the ids read, in order, instead of ContainerIDs or beside them (then
	// the same ids in the same order: a launcher that also speaks to an
	// older statsd; Containers is the set used). gVisor:
	// optional names for the containers runsc's state files list. The set at
	// the bind; UpdateWorkloadContainers changes it during the activation
	// (identity keeps the current one). Equal ignores it and ContainerIDs.
	Containers []ContainerRef `json:"containers,omitempty"`
	// Optional, either class: the VMM process and its QMP socket.
	VMMPID     int    `json:"vmm_pid,omitempty"`
	VMMPIDFile string `json:"vmm_pid_file,omitempty"`
	QMPSocket  string `json:"qmp_socket,omitempty"`
	// SentryStartTicks is not the launcher's: statsd learns it when it binds
	// a gVisor sandbox by sentry pid (the sentry's start time, stat field
	// 22, at the pin) and persists it with the binding, so that a restarted
	// statsd refuses a pid that a new process holds by now. Zero: not
	// learned. Equal ignores it.
	SentryStartTicks uint64 `json:"sentry_start_ticks,omitempty"`
}

// Equal reports whether two refs name the same sandbox: SentryStartTicks
// apart (a launcher's retry does not carry it) and the container set apart
// (ContainerIDs, Containers: a sandbox whose set changed is the same
// sandbox; a Run repeated with another set updates the set).
func (r SandboxRef) Equal(o SandboxRef) bool {
	return r.Class == o.Class && r.CgroupPath == o.CgroupPath && r.SentryPID == o.SentryPID &&
		r.AgentAddress == o.AgentAddress &&
		r.VMMPID == o.VMMPID && r.VMMPIDFile == o.VMMPIDFile && r.QMPSocket == o.QMPSocket
}

// ContainerRef names one container of a workload (the wire's ContainerRef).
type ContainerRef struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
}

// ContainerSet is the ref's container set: Containers, or ContainerIDs
// without names. A new slice.
func (r SandboxRef) ContainerSet() []ContainerRef {
	if len(r.Containers) > 0 {
		return slices.Clone(r.Containers)
	}
	var out []ContainerRef
	for _, id := range r.ContainerIDs {
		out = append(out, ContainerRef{ID: id})
	}
	return out
}

// WithContainers returns r with set as its container set (Containers; the
// ids form dropped), unless set is what r holds already.
func (r SandboxRef) WithContainers(set []ContainerRef) SandboxRef {
	if slices.Equal(r.ContainerSet(), set) {
		return r
	}
	r.ContainerIDs, r.Containers = nil, slices.Clone(set)
	return r
}

// ContainerIDsOf lists the ids of set, in order.
func ContainerIDsOf(set []ContainerRef) []string {
	out := make([]string, 0, len(set))
	for _, c := range set {
		out = append(out, c.ID)
	}
	return out
}

// AddCounter returns sum + v as a new value: v alone when sum is nil, sum
// when v is nil (an absent counter adds nothing).
func AddCounter(sum, v *uint64) *uint64 {
	if v == nil {
		return sum
	}
	n := *v
	if sum != nil {
		n += *sum
	}
	return &n
}

// ContainerSetter is a Source whose container set can change while it stays
// open (the guest agent's: it reads the ids it is given). The set is valid
// for the source's class; it applies from the next Sample on, keeping the
// connection and everything else.
type ContainerSetter interface {
	SetContainers(set []ContainerRef)
}

// Persistent is a Source with derived state that must survive statsd's
// restart (the gVisor breakdown's split: without it a restarted statsd
// would split the pod's whole history again among the containers listed
// now). The store persists BreakdownState with the binding (at most
// MaxBreakdownStateBytes; nil: nothing to persist yet) and gives it back
// through RestoreBreakdownState when it opens the source of a restored
// binding, before its first Sample. Both must not wait for a Sample in
// progress; a state the source refuses (RestoreBreakdownState's error) is
// dropped and the source starts afresh.
type Persistent interface {
	BreakdownState() ([]byte, error)
	RestoreBreakdownState(state []byte) error
}

// MaxBreakdownStateBytes caps one source's persisted state (Persistent).
const MaxBreakdownStateBytes = 32 << 10

// Kind is where a Reading's numbers come from.
type Kind int

const (
	KindUnspecified Kind = iota
	// KindCgroup: the sandbox's host cgroup.
	KindCgroup
	// KindGuestAgent: the guest agent inside a micro-VM.
	KindGuestAgent
)

// Absent records a measurement the source could not offer, and why.
type Absent struct {
	Field  string // the WorkloadStatsSample field name, e.g. "memory_peak_bytes"
	Reason string
}

// ContainerError records a workload container a guest agent could not report.
type ContainerError struct {
	ID     string
	Reason string
}

// UnreadError is returned when no container of a reading could be read. It
// wraps the sentinel that classifies the failure and keeps why each container
// failed: an agent that answered "unknown container" for every id did
// answer, which the drift check needs to tell from silence.
type UnreadError struct {
	Containers []ContainerError
	Err        error
}

func (e *UnreadError) Error() string { return e.Err.Error() }
func (e *UnreadError) Unwrap() error { return e.Err }

// NoProcessLeft reports whether r found its sandbox without a process: none
// in its cgroup (SandboxProcesses 0). The one test of it (identity's
// outcome, drift's SANDBOX_DEAD). A cgroup whose processes are all in
// cgroups below it (a pod-level cgroup, the kubelet's cgroup_parent) reads
// so too: counting the subtree is left to do (pids.current, on this host,
// is not always the bound cgroup's own).
func (r *Reading) NoProcessLeft() bool {
	return r.SandboxProcesses != nil && *r.SandboxProcesses == 0
}

// Reading is one measurement of a sandbox. Units are in the field names.
type Reading struct {
	Kind   Kind
	Detail string // which cgroup mode and paths, or which agent and version

	MemoryCurrentBytes    uint64  // gauge
	MemoryPeakBytes       *uint64 // peak within the epoch; nil when not offered (see Absent)
	MemoryWorkingSetBytes uint64  // gauge, current minus inactive file, floored at 0
	CPUUsageUsec          *uint64 // counter; nil when not offered (see Absent)

	// SandboxProcesses is the number of processes in the sandbox cgroup
	// itself (its cgroup.procs); nil when the source cannot tell. 0 is a
	// dead sandbox (NoProcessLeft).
	SandboxProcesses *uint32
	// SentryExited: a gVisor sandbox bound by sentry pid whose pinned
	// sentry has exited (or its pid now belongs to another process). The
	// sandbox is dead, whatever its cgroup still holds (a gofer on its way
	// out, a process someone else put there).
	SentryExited bool `json:",omitempty"`
	// UnreadContainers lists the containers missing from a partial reading.
	UnreadContainers []ContainerError
	// Absent lists the measurements the source could not offer.
	Absent []Absent

	// Signals and traffic (signals.go); nil when not offered.
	Memory     *MemorySignals
	Throttling *CPUThrottling
	Pressure   *Pressure
	Pids       *Pids
	Network    *Network
	BlockIO    *BlockIO

	// Containers are the workload's containers measured one by one, in the
	// order the ref lists them; empty when the source offers no
	// per-container figures. The figures above stay the whole sandbox's (a
	// guest agent's: the sums of the containers read).
	Containers []Container `json:",omitempty"`
	// SandboxOwnCPUUsec is a gVisor sandbox's own share of its CPU (the
	// sentry's and gofers' host CPU plus the pause container's part of the
	// rest; see the proto): counter, nil when not offered (see Absent,
	// field "sandbox_own_cpu_usec").
	SandboxOwnCPUUsec *uint64 `json:",omitempty"`
}

// Container is one container of a workload measured on its own. Units are
// in the field names; a nil figure is absent (Absent says why), never 0.
type Container struct {
	ID   string
	Name string `json:",omitempty"` // the container's name in its pod, when statsd was told it

	CPUUsageUsec  *uint64 `json:",omitempty"` // counter
	CPUUserUsec   *uint64 `json:",omitempty"` // counter, user mode
	CPUSystemUsec *uint64 `json:",omitempty"` // counter, kernel mode
	// MemoryCurrentBytes and MemoryWorkingSetBytes (gauges) are set only
	// when MemoryIsOwn: the container's own cgroup's figures, never a share
	// of the sandbox's.
	MemoryCurrentBytes    *uint64 `json:",omitempty"`
	MemoryWorkingSetBytes *uint64 `json:",omitempty"`
	MemoryIsOwn           bool    `json:",omitempty"`
	PidsCurrent           *uint64 `json:",omitempty"` // gauge
	// Exited: the container left the workload during the activation; its
	// counters are the last read, its gauges absent (identity keeps it).
	Exited bool `json:",omitempty"`
	// Absent names the figures above that are nil and why (Field as in
	// the wire's ContainerStats, e.g. "cpu_usage_usec").
	Absent []Absent `json:",omitempty"`
}

// Source reads one sandbox. Sample must honour ctx's deadline and must be
// safe for concurrent use; Close releases connections and must be safe to
// call more than once.
type Source interface {
	Sample(ctx context.Context) (Reading, error)
	Close() error
}

// HostSampler reads the runner-layer (host) views of one sandbox. Each view
// reports its own shortfall inside the returned HostStats, so an error means
// no view at all could be produced.
type HostSampler interface {
	SampleHost(ctx context.Context) (*HostStats, error)
	Close() error
}

package source

// This file holds the host (runner-layer) views of a sandbox as statsd's
// packages speak them: hoststat builds them, internal/server converts them to
// the wire. They mirror proto/sandboxstats/v1/host.proto field by field, with
// the same units in the names; the proto's comments give each field's unit,
// layer and kind (counter, gauge, peak, sum, label). A nil pointer is an
// absent message or optional value, as in the proto; the enums are numbered
// as the proto's.

// HostStats holds the runner-layer (host) views of a sandbox. Each view
// reports its own shortfall, so one failing view never loses the others.
type HostStats struct {
	ObservedAtUnixNano int64
	// UnavailableReason is set when no host view could be produced at all.
	UnavailableReason string
	// GuestName is the guest's name, "anonymous" when nothing names it;
	// GuestNameSource says where it came from: "pid-file-dir",
	// "qemu-cmdline" or "none".
	GuestName       string
	GuestNameSource string
	RunnerKernel    *RunnerKernelView
	VMMThreads      *VMMThreadsView
	KVM             *KVMView
}

// RunnerKernelView is the host kernel's /proc/stat, CPU lines only.
type RunnerKernelView struct {
	Legend string
	// Error says why the view could not be read; the figures are then
	// absent.
	Error  string
	Total  *CPUTimes
	PerCPU []CPUTimes // ordered by CPU number
}

// CPUTimes is one /proc/stat CPU line in usec; every number is a counter of
// CPU time since host boot. User includes guest, nice includes guest_nice.
type CPUTimes struct {
	CPU           string // "cpu" for the total line, "cpu<N>" for one CPU
	UserUsec      uint64
	NiceUsec      uint64
	SystemUsec    uint64
	IdleUsec      uint64
	IowaitUsec    uint64
	IRQUsec       uint64
	SoftIRQUsec   uint64
	StealUsec     uint64
	GuestUsec     uint64
	GuestNiceUsec uint64
}

// VMMThreadClass splits VMM threads by what they do.
type VMMThreadClass int

const (
	VMMThreadClassUnspecified VMMThreadClass = iota
	// VMMThreadClassVCPU: QEMU "CPU <n>/KVM", Cloud Hypervisor "vcpu<n>",
	// Firecracker "fc_vcpu <n>".
	VMMThreadClassVCPU
	// VMMThreadClassOther: VMM overhead, which no guest counter sees.
	VMMThreadClassOther
)

// VMMThreadsView lists the VMM's threads (for gVisor, the sandbox's
// processes' threads) with the host scheduler's accounting.
type VMMThreadsView struct {
	Legend string
	// Error says why the view could not be read at all.
	Error string
	// ProcessSource says how the processes were found, e.g.
	// "vmm_pid_file /run/srv1/qemu.pid" or "sentry_pid 1234".
	ProcessSource string
	PIDs          []int32
	Threads       []VMMThread // ordered by pid then tid
	// VCPUTotals and OtherTotals sum the threads present at this sample:
	// sums, not counters (a thread exiting makes them drop).
	VCPUTotals  *VMMThreadTotals
	OtherTotals *VMMThreadTotals
	// ReusedTIDs were seen in the previous sample with another start time.
	ReusedTIDs []int32
	// ThreadErrors: threads not read fully, and per class the threads
	// without schedstat.
	ThreadErrors []string
	UserHZ       uint32
}

// VMMThread is one host thread of the VMM.
type VMMThread struct {
	PID            int32
	TID            int32
	Name           string // comm, e.g. "CPU 0/KVM"
	StartTimeTicks uint64 // stat field 22; with TID it names the thread
	Class          VMMThreadClass
	VCPUIndex      *int32 // set only for vCPU threads
	UtimeUsec      uint64 // includes GuestTimeUsec
	StimeUsec      uint64
	GuestTimeUsec  uint64
	// From schedstat; nil when it could not be read (never 0 for unknown).
	RunNs      *uint64
	RunDelayNs *uint64
	RunCount   *uint64
}

// VMMThreadTotals sums one class over the threads present at a sample. None
// of the sums is a counter; the run sums cover only threads with schedstat.
type VMMThreadTotals struct {
	Class         VMMThreadClass
	Threads       uint32
	UtimeUsec     uint64
	StimeUsec     uint64
	GuestTimeUsec uint64
	RunNs         uint64
	RunDelayNs    uint64
}

// KVMCounterKind says how a KVM counter may be used.
type KVMCounterKind int

const (
	KVMCounterKindUnspecified KVMCounterKind = iota
	// KVMCounterKindCumulative grows until reset: it may be differenced.
	KVMCounterKindCumulative
	// KVMCounterKindGauge is a current level (KVM "instant").
	KVMCounterKindGauge
	// KVMCounterKindPeak is a high-water mark.
	KVMCounterKindPeak
)

// KVMSource names where KVM counters were read.
type KVMSource int

const (
	KVMSourceUnspecified KVMSource = iota
	// KVMSourceDebugfs: the per-VM files under <debugfs>/kvm/<pid>-<fd>/.
	KVMSourceDebugfs
	// KVMSourceQMP: QEMU QMP query-stats (provider kvm).
	KVMSourceQMP
)

// KVMSourceState is how far a KVM source could be read.
type KVMSourceState int

const (
	KVMSourceStateUnspecified KVMSourceState = iota
	KVMSourceStateAvailable
	// KVMSourceStatePartial: some cumulative counters read, others refused.
	KVMSourceStatePartial
	// KVMSourceStateUnavailable: no cumulative counter could be read.
	KVMSourceStateUnavailable
	// KVMSourceStateNotConfigured: the source was not asked for.
	KVMSourceStateNotConfigured
)

// KVMView gathers the KVM sources, each with its own state.
type KVMView struct {
	Legend  string
	Debugfs *KVMSourceView
	QMP     *KVMSourceView
}

// KVMSourceView is what one KVM source gave.
type KVMSourceView struct {
	Source KVMSource
	State  KVMSourceState
	// Reason says why the source is unavailable, partial or not configured,
	// or how it was read when that is worth saying.
	Reason string
	// Origin is the debugfs directory ("kvm/1234-11") or the QMP socket.
	Origin   string
	Counters []KVMCounter
	// Absent lists the counters listed but not delivered, "name: reason".
	Absent []string
}

// KVMCounter is one KVM statistic.
type KVMCounter struct {
	Name  string
	Kind  KVMCounterKind
	Scope string // "vm", "vcpu-sum", "vcpu<N>" or "qom:<path>"
	Value uint64
	Unit  string // "count", "ns", "boolean", ...
}

var (
	threadClassNames = [...]string{"unspecified", "vcpu", "other"}
	counterKindNames = [...]string{"unspecified", "cumulative", "gauge", "peak"}
	kvmSourceNames   = [...]string{"unspecified", "debugfs", "qmp"}
	sourceStateNames = [...]string{"unspecified", "available", "partial", "unavailable", "not configured"}
)

func enumName(names []string, i int) string {
	if i < 0 || i >= len(names) {
		return "unknown"
	}
	return names[i]
}

// String returns "vcpu", "other" or "unspecified".
func (c VMMThreadClass) String() string { return enumName(threadClassNames[:], int(c)) }

// String returns "cumulative", "gauge", "peak" or "unspecified".
func (k KVMCounterKind) String() string { return enumName(counterKindNames[:], int(k)) }

// String returns "debugfs", "qmp" or "unspecified".
func (s KVMSource) String() string { return enumName(kvmSourceNames[:], int(s)) }

// String returns "available", "partial", "unavailable", "not configured" or
// "unspecified".
func (s KVMSourceState) String() string { return enumName(sourceStateNames[:], int(s)) }

// MarshalText makes JSON (logs, test goldens) show the names.
func (c VMMThreadClass) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// MarshalText makes JSON (logs, test goldens) show the names.
func (k KVMCounterKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// MarshalText makes JSON (logs, test goldens) show the names.
func (s KVMSource) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText makes JSON (logs, test goldens) show the names.
func (s KVMSourceState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

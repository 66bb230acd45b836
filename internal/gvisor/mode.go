package gvisor

import "fmt"

// Mode is the cgroup layout of the host.
type Mode int

const (
	// ModeAuto detects the mode from CgroupRoot once, at Open.
	ModeAuto Mode = iota
	// ModeUnified: CgroupRoot is a cgroup2 mount; one path holds memory and CPU.
	ModeUnified
	// ModeHybrid: CgroupRoot holds v1 hierarchies and a cgroup2 mount at
	// CgroupRoot/unified. Memory is only on v1 there, so v1 is read.
	ModeHybrid
	// ModeLegacy: v1 hierarchies only.
	ModeLegacy
)

// String returns the lower-case name used in source details.
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeUnified:
		return "unified"
	case ModeHybrid:
		return "hybrid"
	case ModeLegacy:
		return "legacy"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

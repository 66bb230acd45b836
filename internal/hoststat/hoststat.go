// Package hoststat reads the runner-layer (host) views of a sandbox: the host
// kernel's /proc/stat, the VMM's threads split into vCPU and other threads,
// and KVM exit counters, each with the legend that keeps it from being
// misread.
package hoststat

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Config holds the roots and bounds of the host views.
type Config struct {
	ProcRoot    string // normally /proc
	DebugfsRoot string // normally /sys/kernel/debug
	ReadTimeout time.Duration
	Logger      *slog.Logger
}

// Sampler reads the host views of one sandbox.
type Sampler struct {
	ref source.SandboxRef
	cfg Config
}

// Open returns a HostSampler for the sandbox ref names.
func Open(ref source.SandboxRef, cfg Config) (source.HostSampler, error) {
	return &Sampler{ref: ref, cfg: cfg}, nil
}

// SampleHost reads every host view once.
func (s *Sampler) SampleHost(ctx context.Context) (*sandboxstatsv1.HostStats, error) {
	return &sandboxstatsv1.HostStats{
		ObservedAtUnixNano: time.Now().UnixNano(),
		UnavailableReason:  "host views not implemented yet",
	}, nil
}

// Close releases nothing yet.
func (s *Sampler) Close() error { return nil }

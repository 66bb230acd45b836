// Package microvm measures a Kata-style micro-VM through its guest agent:
// ttrpc StatsContainer over hybrid vsock (a Unix socket plus a CONNECT
// handshake) or vsock, summed over the workload's containers.
package microvm

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Config holds the bounds of a micro-VM source.
type Config struct {
	CallTimeout time.Duration // bound of every agent call
	Logger      *slog.Logger
}

// Open returns a Source for the guest agent ref names. It does not dial
// until the first Sample.
func Open(ref source.SandboxRef, cfg Config) (source.Source, error) {
	return nil, fmt.Errorf("microvm: %w: guest agent reader not implemented yet", source.ErrNotMeasurable)
}

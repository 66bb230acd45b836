// This file reads the sandbox's network counters: the host kernel's
// /proc/<sentry pid>/net/dev, the counters of the network namespace the
// sentry runs in, read under the sentry's start-time pin.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// whyNoPID is the network's absent reason for a source bound by cgroup path.
const whyNoPID = "bound by cgroup path: no sentry pid, so no network namespace to read (bind by sentry pid for network counters)"

// netResult is the network part of a Reading, or why it is absent, or an
// error that fails the sample (a timeout, a malformed file).
type netResult struct {
	net *source.Network
	why string
	err error
	// exited: the pinned sentry has exited or its pid was reused.
	exited bool
}

// readNetwork reads <ProcRoot>/<sentry pid>/net/dev between two reads of
// the sentry's start time, which must both be the pinned one: a pid that
// exited or was reused is never read under this identity.
func (s *cgroupSource) readNetwork(ctx context.Context) netResult {
	pid := s.ref.SentryPID
	if pid == 0 {
		return netResult{why: whyNoPID}
	}
	s.mu.Lock()
	want, pinned := s.sentry.StartTicks, s.pinned
	s.mu.Unlock()
	if !pinned {
		return netResult{why: fmt.Sprintf("sentry pid %d is not pinned yet", pid)}
	}
	p := filepath.Join(s.procRoot, strconv.Itoa(pid), "net", "dev")
	b, err := bounded.Do(ctx, s.g, "netdev\x00"+p, func() ([]byte, error) { return snapNetDev(s.procRoot, pid, want, p) })
	switch {
	case errors.Is(err, errPidChanged) || (process.IsGone(err) && !errors.Is(err, errNoNetDev)):
		return netResult{why: fmt.Sprintf("sentry pid %d was reused/exited: its network namespace is not read (%v)", pid, err), exited: true}
	case errors.Is(err, errNoNetDev):
		return netResult{why: "no " + p}
	case err != nil:
		return netResult{err: wrapRead(err)}
	}
	ifaces, err := parseNetDev(b)
	if err != nil {
		return netResult{err: fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, p, err)}
	}
	return netResult{net: source.NewNetwork(source.NetworkLayerHostNamespace, p, ifaces)}
}

// errNoNetDev: the sentry is there (same start time) but has no net/dev.
var errNoNetDev = errors.New("no net/dev file")

// snapNetDev reads the net/dev file p of pid between two reads of its start
// time, both of which must be want.
func snapNetDev(procRoot string, pid int, want uint64, p string) ([]byte, error) {
	check := func() error {
		st, err := startTime(procRoot, pid)
		if err != nil {
			return err
		}
		if st != want {
			return fmt.Errorf("%w: start time %d, pinned %d", errPidChanged, st, want)
		}
		return nil
	}
	if err := check(); err != nil {
		return nil, err
	}
	b, rerr := bounded.ReadFile(p, bounded.MaxFileBytes)
	if err := check(); err != nil {
		return nil, err
	}
	if process.IsGone(rerr) {
		return nil, fmt.Errorf("%w: %w", errNoNetDev, rerr)
	}
	return b, rerr
}

// addNetwork puts a network result into r.
func addNetwork(r *source.Reading, n netResult) {
	switch {
	case n.net == nil:
		absent(r, "network", n.why)
	case n.net.LoopbackOnly:
		r.Network = n.net
		absent(r, "network.total", "the sandbox's network namespace has no interface but loopback (runsc --network=none): no network, not a zero one")
	default:
		r.Network = n.net
	}
}

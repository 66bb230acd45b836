package hoststat

// This file decides which host processes the VMM thread view reads: the VMM
// named by the ref (its pid, or its pid file read at every sample), or a
// gVisor sandbox's processes as Config.SandboxProcesses lists them. The VMM
// or sentry is pinned at its first sample (start time and executable): a pid
// that another process has since is refused.

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// processes returns the host pids whose threads the VMM view lists: the VMM
// (from VMMPID or VMMPIDFile), or for gVisor the sentry and its sandbox's
// processes. procs[0] is the VMM or sentry.
func (s *sampler) processes(ctx context.Context) (procs []int32, how string, err error) {
	procs, how, err = s.namedProcesses(ctx)
	if err != nil {
		return nil, how, err
	}
	if err := s.checkPin(ctx, procs[0]); err != nil {
		return nil, how, err
	}
	return procs, how, nil
}

// checkPin refuses a VMM or sentry pid that no longer names the process
// pinned behind it.
func (s *sampler) checkPin(ctx context.Context, pid int32) error {
	key := fmt.Sprintf("hoststat:pin:%s/%d", s.cfg.ProcRoot, pid)
	_, err := bounded.Do(ctx, s.g, key, func() (process.Pin, error) { return s.pin.Check(int(pid)) })
	switch {
	case errors.Is(err, process.ErrReused):
		return fmt.Errorf("%w: %w: %w", source.ErrNotMeasurable, source.ErrSandboxGone, err)
	case process.IsGone(err):
		return fmt.Errorf("%w: process %d is gone: %w", source.ErrNotMeasurable, pid, err)
	case errors.Is(err, process.ErrMalformedStat):
		return fmt.Errorf("%w: %w", source.ErrMalformed, err)
	}
	return err
}

// namedProcesses is what the ref names, before pinning.
func (s *sampler) namedProcesses(ctx context.Context) (procs []int32, how string, err error) {
	switch {
	case s.ref.VMMPID > 0:
		return []int32{int32(s.ref.VMMPID)}, fmt.Sprintf("vmm_pid %d", s.ref.VMMPID), nil
	case s.ref.VMMPIDFile != "":
		how = "vmm_pid_file " + s.ref.VMMPIDFile
		pid, err := s.vmmPIDFromFile(ctx)
		if err != nil {
			return nil, how, err
		}
		return []int32{pid}, how, nil
	case s.ref.SentryPID > 0:
		how = fmt.Sprintf("sentry_pid %d", s.ref.SentryPID)
		procs, err := s.sandboxProcesses(ctx, int32(s.ref.SentryPID))
		return procs, how, err
	}
	return nil, "", fmt.Errorf("%w: %w", source.ErrNotMeasurable, errNoVMM)
}

// vmmPIDFromFile reads the VMM pid file (a regular file only, never its
// content in an error: the launcher may name any file) under the read bound.
func (s *sampler) vmmPIDFromFile(ctx context.Context) (int32, error) {
	path := s.ref.VMMPIDFile
	pid, err := bounded.Do(ctx, s.g, "hoststat:pidfile:"+path, func() (int, error) { return process.ReadPIDFile(path) })
	switch {
	case errors.Is(err, process.ErrNotPID):
		return 0, fmt.Errorf("%w: vmm pid file: %w", source.ErrMalformed, err)
	case err != nil:
		return 0, fmt.Errorf("%w: vmm pid file: %w", source.ErrNotMeasurable, err)
	}
	return int32(pid), nil
}

// sandboxProcesses returns a gVisor sandbox's processes, the sentry first,
// from Config.SandboxProcesses run under the read bound.
func (s *sampler) sandboxProcesses(ctx context.Context, sentry int32) ([]int32, error) {
	list := s.cfg.SandboxProcesses
	if list == nil {
		return nil, fmt.Errorf("%w: sentry_pid %d: no gVisor process discovery configured (hoststat.Config.SandboxProcesses)", source.ErrNotMeasurable, sentry)
	}
	key := fmt.Sprintf("hoststat:sandbox:%s/%d", s.cfg.ProcRoot, sentry)
	procs, err := bounded.Do(ctx, s.g, key, func() ([]int32, error) { return list(s.cfg.ProcRoot, sentry) })
	if err == nil && (len(procs) == 0 || procs[0] != sentry) {
		err = fmt.Errorf("%w: sandbox processes of sentry %d do not start with the sentry: %v", source.ErrMalformed, sentry, procs)
	}
	return procs, err
}

// This file is admission: the ceiling and whether a ref names a sandbox
// another actor's binding measures.

package identity

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// admit reports why actor may not bind ref (its sources src, once opened;
// its names resolved to mine) beside the bindings of v: the ceiling (for an
// actor not bound yet) and a sandbox measured for another actor, by the
// names as given (cheap) and by what they resolve to where both sides'
// resolved (their names as last looked at: refreshNames). Nil admits it.
func (s *Store) admit(v *view, actorUID string, ref source.SandboxRef, src source.Source, mine resolved) error {
	for _, b := range v.bindings {
		if b.Identity.ActorUID == actorUID {
			continue
		}
		what := sameSandbox(b.Ref, ref)
		if what == "" {
			what = sameCgroup(cgroupOf(b.Ref, b.Source), cgroupOf(ref, src))
		}
		if what == "" {
			what = sameResolved(ref, mine, b.Ref, b.names.get())
		}
		if what != "" {
			return fmt.Errorf("%w: %s is measured for actor %q; checkpoint it before binding %q", ErrOtherWorkload, what, b.Identity.ActorUID, actorUID)
		}
	}
	if v.bound(actorUID) == nil && len(v.bindings) >= s.cfg.MaxWorkloads {
		return fmt.Errorf("%w: %d of %d bound (statsd --max-workloads); checkpoint one before binding %q", ErrTooManyWorkloads, len(v.bindings), s.cfg.MaxWorkloads, actorUID)
	}
	return nil
}

// sameSandbox names what a and b share that makes them one sandbox (a
// cgroup or one nested in the other, a sentry, a guest, a VMM), or "".
func sameSandbox(a, b source.SandboxRef) string {
	switch {
	case a.CgroupPath != "" && b.CgroupPath != "":
		if what := sameCgroup(a.CgroupPath, b.CgroupPath); what != "" {
			return what
		}
	case a.SentryPID != 0 && a.SentryPID == b.SentryPID:
		return fmt.Sprintf("sentry pid %d", a.SentryPID)
	}
	switch {
	case a.AgentAddress != "" && b.AgentAddress != "" && sameGuest(a.AgentAddress, b.AgentAddress):
		return fmt.Sprintf("the guest of agent address %q", b.AgentAddress)
	case a.VMMPID != 0 && a.VMMPID == b.VMMPID:
		return fmt.Sprintf("vmm pid %d", a.VMMPID)
	case a.VMMPIDFile != "" && a.VMMPIDFile == b.VMMPIDFile:
		return fmt.Sprintf("vmm pid file %q", a.VMMPIDFile)
	case a.QMPSocket != "" && a.QMPSocket == b.QMPSocket:
		return fmt.Sprintf("qmp socket %q", a.QMPSocket)
	}
	return ""
}

// sameCgroup names the cgroup when a and b (paths under one mount, "" for
// unknown) are one cgroup or one holds the other (a parent's numbers hold
// its children's), or "".
func sameCgroup(a, b string) string {
	switch {
	case a == "" || b == "":
		return ""
	case a == b:
		return fmt.Sprintf("cgroup %q", a)
	case strings.HasPrefix(b, strings.TrimSuffix(a, "/")+"/"):
		return fmt.Sprintf("cgroup %q (holding %q)", a, b)
	case strings.HasPrefix(a, strings.TrimSuffix(b, "/")+"/"):
		return fmt.Sprintf("cgroup %q (inside %q)", a, b)
	}
	return ""
}

// sandboxCgrouper is a source that knows its sandbox's cgroup (the gVisor
// source, once it found the sentry).
type sandboxCgrouper interface {
	SandboxCgroup() (path string, ok bool)
}

// cgroupOf is the cgroup ref measures: its path, or where its source found
// the sentry; "" when unknown.
func cgroupOf(ref source.SandboxRef, src source.Source) string {
	if ref.CgroupPath != "" {
		return ref.CgroupPath
	}
	if c, ok := src.(sandboxCgrouper); ok {
		if p, ok := c.SandboxCgroup(); ok {
			return p
		}
	}
	return ""
}

// sameGuest reports whether two agent addresses reach one guest: one
// hybrid-vsock socket (any port) or one vsock CID (any port).
func sameGuest(a, b string) bool {
	pa, errA := microvm.ParseAddress(a)
	pb, errB := microvm.ParseAddress(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return pa.Scheme == pb.Scheme && pa.Path == pb.Path && pa.CID == pb.CID
}

// refreshNames looks again at what the names of v's bindings other than
// actorUID's resolve to where they are not settled, so that admit compares
// with what they lead to now.
func (s *Store) refreshNames(ctx context.Context, v *view, actorUID string) {
	for _, b := range v.bindings {
		if b.Identity.ActorUID != actorUID {
			s.namesOf(ctx, b)
		}
	}
}

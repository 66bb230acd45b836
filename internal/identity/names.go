// This file resolves what a ref's names lead to, so that one sandbox named
// two ways (its socket through a symlink or a hard link, a pid file holding
// a bound VMM's pid, a sentry forked into a bound cgroup) is still one
// sandbox: at Bind where the names resolve then, and at the binding's reads
// until they have all resolved.

package identity

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// resolved is what a ref's socket paths and VMM pid file led to when last
// looked at. A nil or zero field is unknown: the ref has no such name, or it
// did not resolve (a socket a starting VMM has not created yet, a pid file
// not written yet, a read past its bound).
type resolved struct {
	agent  os.FileInfo // the hybrid-vsock socket, after symlinks
	qmp    os.FileInfo // the QMP socket, after symlinks
	vmmPID int         // the ref's VMM pid, or the one its pid file holds
}

// resolveRef looks up what ref's names lead to now: its hybrid-vsock and QMP
// sockets by device and inode (stat, following symlinks) and the pid its VMM
// pid file holds (process.ReadPIDFile: a regular file, bounded), each under
// g's bound and ctx. A name that does not resolve stays unknown.
func resolveRef(ctx context.Context, g *bounded.Group, ref source.SandboxRef) resolved {
	stat := func(path string) os.FileInfo {
		fi, err := bounded.Do(ctx, g, "stat\x00"+path, func() (os.FileInfo, error) { return os.Stat(path) })
		if err != nil {
			return nil
		}
		return fi
	}
	var r resolved
	if a, err := microvm.ParseAddress(ref.AgentAddress); err == nil && a.Scheme == microvm.SchemeHybridVsock {
		r.agent = stat(a.Path)
	}
	if ref.QMPSocket != "" {
		r.qmp = stat(ref.QMPSocket)
	}
	switch {
	case ref.VMMPID != 0:
		r.vmmPID = ref.VMMPID
	case ref.VMMPIDFile != "":
		pid, err := bounded.Do(ctx, g, "pidfile\x00"+ref.VMMPIDFile, func() (int, error) { return process.ReadPIDFile(ref.VMMPIDFile) })
		if err == nil {
			r.vmmPID = pid
		}
	}
	return r
}

// hasNamesToResolve reports whether ref names something whose identity is
// known only once it resolves: a sentry by pid (its cgroup), a hybrid-vsock
// or QMP socket, a VMM pid file. A cgroup path, a vsock cid and a VMM pid
// are compared as given.
func hasNamesToResolve(ref source.SandboxRef) bool {
	return ref.SentryPID != 0 || strings.HasPrefix(ref.AgentAddress, "hvsock://") || ref.QMPSocket != "" || ref.VMMPIDFile != ""
}

// complete reports whether every name of ref that resolves has resolved in
// r, and its source (src) found the sentry of a ref by sentry pid.
func (r resolved) complete(ref source.SandboxRef, src source.Source) bool {
	return (!strings.HasPrefix(ref.AgentAddress, "hvsock://") || r.agent != nil) &&
		(ref.QMPSocket == "" || r.qmp != nil) &&
		(ref.VMMPIDFile == "" || r.vmmPID != 0) &&
		(ref.SentryPID == 0 || cgroupOf(ref, src) != "")
}

// sameResolved names what a's names (ref a, resolved ra) resolve to that b's
// do too, or "": one socket file however reached, one VMM pid however given.
func sameResolved(a source.SandboxRef, ra resolved, b source.SandboxRef, rb resolved) string {
	switch {
	case ra.agent != nil && rb.agent != nil && os.SameFile(ra.agent, rb.agent):
		return fmt.Sprintf("the guest of agent address %q (its socket is the one of %q, by device and inode)", a.AgentAddress, b.AgentAddress)
	case ra.qmp != nil && rb.qmp != nil && os.SameFile(ra.qmp, rb.qmp):
		return fmt.Sprintf("qmp socket %q (the one of %q, by device and inode)", a.QMPSocket, b.QMPSocket)
	case ra.vmmPID != 0 && ra.vmmPID == rb.vmmPID:
		if a.VMMPIDFile != "" {
			return fmt.Sprintf("vmm pid %d (held by pid file %q)", ra.vmmPID, a.VMMPIDFile)
		}
		return fmt.Sprintf("vmm pid %d", ra.vmmPID)
	}
	return ""
}

// names is what a binding's names resolved to when last looked at, and
// whether they are settled: all resolved, at a read that found them shared
// with no other binding. Safe for concurrent use.
type names struct {
	r       atomic.Pointer[resolved]
	settled atomic.Bool // written under mu; read without it

	mu  sync.Mutex
	gen uint64 // under mu: how many times the names were unsettled
}

// checkStart returns the generation a check of the names begins in.
func (n *names) checkStart() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gen
}

// settle marks the names settled, unless another binding's check unsettled
// them since gen (then the next read looks again).
func (n *names) settle(gen uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gen == gen {
		n.settled.Store(true)
	}
}

// unsettle makes the next read look again.
func (n *names) unsettle() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen++
	n.settled.Store(false)
}

// newNames starts the names of a binding of ref, resolved to r; a ref with
// nothing to resolve is settled from the start.
func newNames(ref source.SandboxRef, r resolved) *names {
	n := &names{}
	n.r.Store(&r)
	n.settled.Store(!hasNamesToResolve(ref))
	return n
}

// get returns what the names resolved to last (zero when n is nil).
func (n *names) get() resolved {
	if n == nil {
		return resolved{}
	}
	return *n.r.Load()
}

// namesOf returns what b's names resolve to: as stored once settled, looked
// up again (and stored) until then.
func (s *Store) namesOf(ctx context.Context, b *Binding) resolved {
	if b.names == nil || b.names.settled.Load() {
		return b.names.get()
	}
	r := resolveRef(ctx, s.g, b.Ref)
	b.names.r.Store(&r)
	return r
}

// guardedSource is the source of a binding with names to resolve. Until a
// successful read finds them all resolved and shared with no other binding
// (settled), each successful read looks again, and is refused
// (source.ErrNotMeasurable and ErrOtherWorkload: UNAVAILABLE NOT_MEASURABLE)
// when another binding measures the same sandbox and that binding is the
// older one or is bound by names no read re-checks (a cgroup path); the
// older of two guarded bindings keeps reading and makes the newer look
// again. A read that fails hands out nothing and checks nothing.
type guardedSource struct {
	inner source.Source
	s     *Store
	b     *Binding
}

var _ source.Source = (*guardedSource)(nil)

func (g *guardedSource) Sample(ctx context.Context) (source.Reading, error) {
	r, err := g.inner.Sample(ctx)
	if err != nil || g.b.names.settled.Load() {
		return r, err
	}
	if what := g.s.sharedAtRead(ctx, g.b); what != "" {
		return source.Reading{}, fmt.Errorf("identity: %w: %w: %s is measured for another actor's binding; this read is refused until that one ends",
			source.ErrNotMeasurable, ErrOtherWorkload, what)
	}
	return r, nil
}

func (g *guardedSource) Close() error { return g.inner.Close() }

// SetContainers passes a new container set to the inner source, when it
// takes one.
func (g *guardedSource) SetContainers(set []source.ContainerRef) {
	if c, ok := g.inner.(source.ContainerSetter); ok {
		c.SetContainers(set)
	}
}

// BreakdownState and RestoreBreakdownState are the inner source's
// (source.Persistent), when it has them.
func (g *guardedSource) BreakdownState() ([]byte, error) {
	if p, ok := g.inner.(source.Persistent); ok {
		return p.BreakdownState()
	}
	return nil, nil
}

func (g *guardedSource) RestoreBreakdownState(state []byte) error {
	if p, ok := g.inner.(source.Persistent); ok {
		return p.RestoreBreakdownState(state)
	}
	return nil
}

// SentryStartTicks and SandboxCgroup are the inner source's (the store's
// checks ask them through the guard).
func (g *guardedSource) SentryStartTicks() (uint64, bool) {
	if p, ok := g.inner.(sentryPinner); ok {
		return p.SentryStartTicks()
	}
	return 0, false
}

func (g *guardedSource) SandboxCgroup() (string, bool) {
	if c, ok := g.inner.(sandboxCgrouper); ok {
		return c.SandboxCgroup()
	}
	return "", false
}

// guard wraps b's source when b has names to resolve.
func (s *Store) guard(b *Binding) {
	if b.Source != nil && hasNamesToResolve(b.Ref) {
		b.Source = &guardedSource{inner: b.Source, s: s, b: b}
	}
}

// sharedAtRead resolves b's names and compares them with every other
// binding's: it names what b shares with a binding that keeps reading, or
// "". b is settled when its names all resolved and nothing is shared.
func (s *Store) sharedAtRead(ctx context.Context, b *Binding) string {
	gen := b.names.checkStart()
	mine := resolveRef(ctx, s.g, b.Ref)
	b.names.r.Store(&mine)
	for _, o := range s.Bindings() {
		if o.Identity.ActorUID == b.Identity.ActorUID {
			continue
		}
		what := sameCgroup(cgroupOf(b.Ref, b.Source), cgroupOf(o.Ref, o.Source))
		if what == "" {
			what = sameResolved(b.Ref, mine, o.Ref, s.namesOf(ctx, o))
		}
		if what == "" {
			continue
		}
		if _, guarded := o.Source.(*guardedSource); guarded && older(b, o) {
			o.names.unsettle() // its next read looks again, and is refused
			continue
		}
		return what
	}
	if mine.complete(b.Ref, b.Source) {
		b.names.settle(gen)
	}
	return ""
}

// older reports whether a was bound before b (its epoch began first; the
// actor uid breaks a tie).
func older(a, b *Binding) bool {
	if a.EpochUnixNano != b.EpochUnixNano {
		return a.EpochUnixNano < b.EpochUnixNano
	}
	return a.Identity.ActorUID < b.Identity.ActorUID
}

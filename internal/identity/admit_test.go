package identity

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Sentry pids of the fake gVisor sources: latePID is not running when it is
// bound (lateSentry), foundPID runs in actor 0's cgroup (foundSentry).
const (
	latePID  = 4444
	foundPID = 4343
)

// sameCase is two refs of one sandbox (TestSameSandboxRefused) or of two
// (TestDistinctSandboxesBind).
type sameCase struct {
	name         string
	bound, other source.SandboxRef
	// names, when set, makes the refs on real files in dir; appear (nil:
	// nothing) makes what was missing when they were bound: the socket a
	// starting VMM creates, the pid file it writes, the sentry forked.
	names func(t *testing.T, dir string, late *lateSentry) (bound, other source.SandboxRef, appear func())
	// atRead: nothing says they are one sandbox when other binds (its names
	// do not resolve yet): it binds, and once appear ran its reads are
	// refused. boundRefused: the first binding's reads are refused instead
	// (the other is bound by a cgroup path, which no read re-checks).
	atRead, boundRefused bool
	// otherReadFirst: other reads once before appear (and answers: nothing
	// shared yet), so that the older binding's read is the one that finds
	// the sandbox shared.
	otherReadFirst bool
}

func TestSameSandboxRefused(t *testing.T) {
	ctx := context.Background()
	gv := source.SandboxRef{Class: source.ClassGVisor, SentryPID: 4242, VMMPID: 77}
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/vm/a.sock:1024", ContainerIDs: []string{"c1"}, QMPSocket: "/run/vm/a.qmp"}
	for _, tc := range []sameCase{
		{name: "same cgroup path", bound: actorRef(0), other: actorRef(0)},
		{name: "same sentry pid", bound: gv, other: source.SandboxRef{Class: source.ClassGVisor, SentryPID: 4242}},
		{name: "same vmm pid", bound: gv, other: source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/x", VMMPID: 77}},
		{name: "same agent address, other containers", bound: vm, other: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: vm.AgentAddress, ContainerIDs: []string{"c2"}}},
		{name: "same qmp socket", bound: vm, other: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/vm/b.sock:1024", ContainerIDs: []string{"c1"}, QMPSocket: vm.QMPSocket}},
		{name: "the parent cgroup", bound: actorRef(0), other: source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/pod"}},
		{name: "a child cgroup", bound: actorRef(0), other: source.SandboxRef{Class: source.ClassGVisor, CgroupPath: actorRef(0).CgroupPath + "/child"}},
		{name: "the same hybrid-vsock socket, another port", bound: vm, other: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/vm/a.sock:1025", ContainerIDs: []string{"c2"}}},
		{name: "the same vsock cid, another port", bound: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1024", ContainerIDs: []string{"x"}},
			other: source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1025", ContainerIDs: []string{"y"}}},
		{name: "a sentry pid whose cgroup is bound by path", bound: actorRef(0), other: source.SandboxRef{Class: source.ClassGVisor, SentryPID: foundPID}},
		{name: "a cgroup path a sentry pid was found in", bound: source.SandboxRef{Class: source.ClassGVisor, SentryPID: foundPID}, other: actorRef(0)},

		// The same sandbox by another name: what the names resolve to.
		{name: "a symlink to the bound hybrid-vsock socket", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			listen(t, filepath.Join(dir, "a.sock"))
			symlink(t, "a.sock", filepath.Join(dir, "l.sock"))
			return vmAt(dir, "a.sock", "c1"), vmAt(dir, "l.sock", "c2"), nil
		}},
		{name: "a hard link to the bound hybrid-vsock socket", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			listen(t, filepath.Join(dir, "a.sock"))
			if err := os.Link(filepath.Join(dir, "a.sock"), filepath.Join(dir, "h.sock")); err != nil {
				t.Fatal(err)
			}
			return vmAt(dir, "a.sock", "c1"), vmAt(dir, "h.sock", "c2"), nil
		}},
		{name: "a symlink to the bound qmp socket", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			listen(t, filepath.Join(dir, "a.qmp"))
			symlink(t, filepath.Join(dir, "a.qmp"), filepath.Join(dir, "l.qmp"))
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.QMPSocket, other.QMPSocket = filepath.Join(dir, "a.qmp"), filepath.Join(dir, "l.qmp")
			return bound, other, nil
		}},
		{name: "a pid file holding the bound vmm pid", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			pid := sleeper(t)
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.VMMPID, other.VMMPIDFile = pid, writePIDFile(t, dir, "b.pid", pid)
			return bound, other, nil
		}},
		{name: "a vmm pid a bound pid file holds", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			pid := sleeper(t)
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.VMMPIDFile, other.VMMPID = writePIDFile(t, dir, "a.pid", pid), pid
			return bound, other, nil
		}},
		{name: "two pid files holding one pid", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			pid := sleeper(t)
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.VMMPIDFile, other.VMMPIDFile = writePIDFile(t, dir, "a.pid", pid), writePIDFile(t, dir, "b.pid", pid)
			return bound, other, nil
		}},

		// Nothing resolves at bind; the first read that finds one sandbox
		// refuses the newer binding (or the one no read re-checks).
		{name: "a sentry pid not running yet, forked into the bound cgroup", atRead: true, names: func(t *testing.T, _ string, late *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			return actorRef(0), source.SandboxRef{Class: source.ClassGVisor, SentryPID: latePID}, late.fork
		}},
		{name: "a cgroup path bound before the sentry bound by pid is forked into it", atRead: true, boundRefused: true, names: func(t *testing.T, _ string, late *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			return source.SandboxRef{Class: source.ClassGVisor, SentryPID: latePID}, actorRef(0), late.fork
		}},
		{name: "a symlink to the socket a starting vmm creates later", atRead: true, names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			symlink(t, "a.sock", filepath.Join(dir, "l.sock"))
			return vmAt(dir, "a.sock", "c1"), vmAt(dir, "l.sock", "c2"), func() { listen(t, filepath.Join(dir, "a.sock")) }
		}},
		{name: "a pid file written after the other read, holding its vmm pid", atRead: true, otherReadFirst: true, names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			pid := sleeper(t)
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			listen(t, filepath.Join(dir, "b.sock"))
			bound.VMMPIDFile, other.VMMPIDFile = filepath.Join(dir, "a.pid"), writePIDFile(t, dir, "b.pid", pid)
			return bound, other, func() { writePIDFile(t, dir, "a.pid", pid) }
		}},
		{name: "two pid files written after both bound, one pid", atRead: true, names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.VMMPIDFile, other.VMMPIDFile = filepath.Join(dir, "a.pid"), filepath.Join(dir, "b.pid")
			return bound, other, func() {
				pid := sleeper(t)
				writePIDFile(t, dir, "a.pid", pid)
				writePIDFile(t, dir, "b.pid", pid)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, b, other, appear := tc.bindFirst(t)
			if tc.atRead {
				checkRefusedAtRead(t, s, b, other, appear, tc)
				return
			}
			if _, _, err := s.Bind(ctx, OpRun, actorID(1), other); !errors.Is(err, ErrOtherWorkload) {
				t.Fatalf("err = %v, want ErrOtherWorkload", err)
			}
			if diff := cmp.Diff([]string{"actor-0"}, boundActors(s)); diff != "" || s.Bound("actor-0") != b {
				t.Fatalf("bindings changed (-want +got):\n%s", diff)
			}
			// The same actor may move to that sandbox's other name.
			if _, _, err := s.Bind(ctx, OpRestore, actorID(0), other); err != nil {
				t.Fatalf("the bound actor itself: %v", err)
			}
		})
	}
}

// checkRefusedAtRead binds other beside b (nothing resolves yet), runs
// appear, and reads both, the newer first: the newer binding's reads are
// refused (the first binding's, when boundRefused) and the other's answer.
func checkRefusedAtRead(t *testing.T, s *Store, b *Binding, other source.SandboxRef, appear func(), tc sameCase) {
	t.Helper()
	ctx := context.Background()
	b1, _, err := s.Bind(ctx, OpRun, actorID(1), other)
	if err != nil {
		t.Fatalf("bind before the names resolve: %v", err)
	}
	if tc.otherReadFirst {
		if _, err := b1.Source.Sample(ctx); err != nil {
			t.Fatalf("read of %s before its names are shared: %v", b1.Identity.ActorUID, err)
		}
		if _, err := b.Source.Sample(ctx); err != nil {
			t.Fatalf("read of %s before its names resolve: %v", b.Identity.ActorUID, err)
		}
	}
	appear()
	if tc.otherReadFirst {
		// The older binding's read finds the sandbox shared and keeps
		// reading; the newer one, settled before, looks again.
		if _, err := b.Source.Sample(ctx); err != nil {
			t.Fatalf("read of %s once shared: %v", b.Identity.ActorUID, err)
		}
	}
	refused, reads := b1, b
	if tc.boundRefused {
		refused, reads = b, b1
	}
	for i := range 2 {
		if _, err := refused.Source.Sample(ctx); !errors.Is(err, ErrOtherWorkload) || !errors.Is(err, source.ErrNotMeasurable) {
			t.Fatalf("read %d of %s: err = %v, want ErrOtherWorkload and ErrNotMeasurable", i+1, refused.Identity.ActorUID, err)
		}
		if _, err := reads.Source.Sample(ctx); err != nil {
			t.Fatalf("read %d of %s: %v", i+1, reads.Identity.ActorUID, err)
		}
	}
}

// TestDistinctSandboxesBind: sandboxes whose names resolve to different
// sockets, pids and cgroups bind side by side, before their names resolve
// too, and both read once they do.
func TestDistinctSandboxesBind(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []sameCase{
		{name: "two hybrid-vsock sockets, one through a symlink", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			listen(t, filepath.Join(dir, "a.sock"))
			listen(t, filepath.Join(dir, "b.sock"))
			symlink(t, "b.sock", filepath.Join(dir, "l.sock"))
			return vmAt(dir, "a.sock", "c1"), vmAt(dir, "l.sock", "c2"), nil
		}},
		{name: "two qmp sockets and two pid files of two vmms", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			listen(t, filepath.Join(dir, "a.qmp"))
			listen(t, filepath.Join(dir, "b.qmp"))
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.QMPSocket, other.QMPSocket = filepath.Join(dir, "a.qmp"), filepath.Join(dir, "b.qmp")
			bound.VMMPIDFile, other.VMMPIDFile = writePIDFile(t, dir, "a.pid", sleeper(t)), writePIDFile(t, dir, "b.pid", sleeper(t))
			return bound, other, nil
		}},
		{name: "sockets and pid files made after both bound", names: func(t *testing.T, dir string, _ *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			bound, other := vmAt(dir, "a.sock", "c1"), vmAt(dir, "b.sock", "c2")
			bound.VMMPIDFile, other.VMMPIDFile = filepath.Join(dir, "a.pid"), filepath.Join(dir, "b.pid")
			return bound, other, func() {
				listen(t, filepath.Join(dir, "a.sock"))
				listen(t, filepath.Join(dir, "b.sock"))
				writePIDFile(t, dir, "a.pid", sleeper(t))
				writePIDFile(t, dir, "b.pid", sleeper(t))
			}
		}},
		{name: "a sentry forked into a cgroup of its own", names: func(t *testing.T, _ string, late *lateSentry) (source.SandboxRef, source.SandboxRef, func()) {
			late.path = "/pod/late-sentry"
			return actorRef(0), source.SandboxRef{Class: source.ClassGVisor, SentryPID: latePID}, late.fork
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, b, other, appear := tc.bindFirst(t)
			b1, _, err := s.Bind(ctx, OpRun, actorID(1), other)
			if err != nil {
				t.Fatalf("a distinct sandbox: %v", err)
			}
			appear()
			for _, r := range []*Binding{b1, b, b1} {
				if _, err := r.Source.Sample(ctx); err != nil {
					t.Fatalf("read of %s: %v", r.Identity.ActorUID, err)
				}
			}
		})
	}
}

// vmAt is a micro-VM ref whose agent listens on the hybrid-vsock socket
// sock in dir, running container c.
func vmAt(dir, sock string, c string) source.SandboxRef {
	return source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock://" + filepath.Join(dir, sock) + ":1024", ContainerIDs: []string{c}}
}

// bindFirst makes the case's store and refs and binds actor 0 to the
// first; it returns the other ref and what makes the names resolve.
func (tc sameCase) bindFirst(t *testing.T) (s *Store, b *Binding, other source.SandboxRef, appear func()) {
	t.Helper()
	s, late := sameStore(t)
	bound, other, appear := tc.refs(t, late)
	b, _, err := s.Bind(context.Background(), OpRun, actorID(0), bound)
	if err != nil {
		t.Fatal(err)
	}
	return s, b, other, appear
}

// refs returns the case's refs (made on real files in a fresh directory
// when names is set) and what makes them resolve (a no-op when nothing).
func (tc sameCase) refs(t *testing.T, late *lateSentry) (bound, other source.SandboxRef, appear func()) {
	t.Helper()
	if tc.names == nil {
		return tc.bound, tc.other, func() {}
	}
	bound, other, appear = tc.names(t, socketDir(t), late)
	if appear == nil {
		appear = func() {}
	}
	return bound, other, appear
}

// sameStore is a store of at most 4 workloads whose gVisor sources by
// sentry pid are found (foundPID, in actor 0's cgroup) or late (latePID:
// not found until late.fork, then in late.path, actor 0's cgroup unless a
// case moves it); the others read a scripted source per cgroup path.
func sameStore(t *testing.T) (*Store, *lateSentry) {
	t.Helper()
	srcs := &perRefSources{}
	late := &lateSentry{path: actorRef(0).CgroupPath}
	s, err := NewStore(Config{Now: fakeClock(), MaxWorkloads: 4, Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
		switch ref.SentryPID {
		case foundPID:
			return &foundSentry{path: actorRef(0).CgroupPath}, nil, nil
		case latePID:
			return late, nil, nil
		}
		return srcs.open(ref)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, late
}

// foundSentry is a gVisor source that found its sentry in path.
type foundSentry struct {
	scriptedSource
	path string
}

func (f *foundSentry) SandboxCgroup() (string, bool) { return f.path, true }

// lateSentry is a gVisor source bound by the pid of a sentry not running
// yet: it finds the sentry's cgroup (path) only once fork was called, as the
// gVisor source resolves a sentry at its first read.
type lateSentry struct {
	scriptedSource
	path   string
	forked atomic.Bool
}

func (l *lateSentry) fork() { l.forked.Store(true) }

func (l *lateSentry) SandboxCgroup() (string, bool) {
	if !l.forked.Load() {
		return "", false
	}
	return l.path, true
}

func (l *lateSentry) Sample(ctx context.Context) (source.Reading, error) {
	if !l.forked.Load() {
		return source.Reading{}, source.ErrNotMeasurable
	}
	return l.scriptedSource.Sample(ctx)
}

// socketDir is a fresh directory with a path short enough for Unix sockets
// (108 bytes with the name), which t.TempDir's, named after the test, is
// not always.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbs-id-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// listen makes a Unix socket at path, listening until the test ends.
func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// sleeper starts a child that runs until the test ends and returns its pid.
func sleeper(t *testing.T) int {
	t.Helper()
	c := exec.Command("sleep", "600")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Process.Kill()
		c.Wait()
	})
	return c.Process.Pid
}

// writePIDFile writes pid to name in dir and returns its path.
func writePIDFile(t *testing.T, dir, name string, pid int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

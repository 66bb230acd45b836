package identity

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

var (
	idA  = Identity{ActorUID: "actor-a", ActorName: "a", ActorNamespace: "ns", TemplateNamespace: "tns", TemplateName: "tpl"}
	idB  = Identity{ActorUID: "actor-b"}
	refA = source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/statstest/a"}
	refB = source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/vm/a.sock:1024", ContainerIDs: []string{"c1"}}
)

// fakeClock ticks one second per call so epochs differ. Safe for
// concurrent use.
func fakeClock() func() time.Time {
	var mu sync.Mutex
	t := time.Unix(1_700_000_000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

func newStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := NewStore(Config{StateDir: dir, Now: fakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestBindReleaseLifecycle(t *testing.T) {
	s := newStore(t, t.TempDir())
	if s.Bound("actor-a") != nil {
		t.Fatal("new store has a binding")
	}
	b1, _, err := s.Bind(context.Background(), OpRun, idA, refA)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Bound("actor-a"); got != b1 {
		t.Fatalf("Current = %+v, want the Run binding", got)
	}

	t.Run("retry is idempotent", func(t *testing.T) {
		b, _, err := s.Bind(context.Background(), OpRun, idA, refA)
		if err != nil || b != b1 {
			t.Fatalf("retry = %p, %v; want the same binding %p", b, err, b1)
		}
	})
	t.Run("another actor naming the same sandbox is refused and changes nothing", func(t *testing.T) {
		_, _, err := s.Bind(context.Background(), OpRun, idB, refA)
		if !errors.Is(err, ErrOtherWorkload) {
			t.Fatalf("err = %v, want ErrOtherWorkload", err)
		}
		if s.Bound("actor-a") != b1 || s.Bound("actor-b") != nil {
			t.Fatal("bindings changed")
		}
	})
	t.Run("invalid request changes nothing", func(t *testing.T) {
		_, _, err := s.Bind(context.Background(), OpRun, idA, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a/../b"})
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
		if s.Bound("actor-a") != b1 {
			t.Fatal("binding changed")
		}
	})
	t.Run("restore starts a new epoch", func(t *testing.T) {
		b, _, err := s.Bind(context.Background(), OpRestore, idA, refA)
		if err != nil {
			t.Fatal(err)
		}
		if b.EpochUnixNano <= b1.EpochUnixNano {
			t.Fatalf("restore epoch %d is not after run epoch %d", b.EpochUnixNano, b1.EpochUnixNano)
		}
	})
	t.Run("checkpoint of another actor is refused", func(t *testing.T) {
		if _, err := s.Release(context.Background(), "actor-b"); !errors.Is(err, ErrActorMismatch) {
			t.Fatalf("err = %v, want ErrActorMismatch", err)
		}
	})
	t.Run("checkpoint clears, a repeat succeeds", func(t *testing.T) {
		if _, err := s.Release(context.Background(), "actor-a"); err != nil {
			t.Fatal(err)
		}
		if s.Bound("actor-a") != nil {
			t.Fatal("still bound after checkpoint")
		}
		if _, err := s.Release(context.Background(), "actor-a"); err != nil {
			t.Fatalf("repeated checkpoint: %v", err)
		}
		if _, err := s.Release(context.Background(), "actor-b"); !errors.Is(err, ErrNoWorkload) {
			t.Fatalf("checkpoint of a never-bound actor: err = %v, want ErrNoWorkload", err)
		}
	})
}

func TestRestartKeepsBinding(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	b, _, err := s.Bind(context.Background(), OpRun, idA, refB)
	if err != nil {
		t.Fatal(err)
	}
	var opened []source.SandboxRef
	s2, err := NewStore(Config{StateDir: dir, Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
		opened = append(opened, ref)
		return nil, nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := s2.Bound("actor-a")
	if got == nil {
		t.Fatal("restarted store lost the binding")
	}
	if diff := cmp.Diff(
		[]any{b.Identity, b.Ref, b.Op, b.EpochUnixNano},
		[]any{got.Identity, got.Ref, got.Op, got.EpochUnixNano}); diff != "" {
		t.Errorf("restored binding (-want +got):\n%s", diff)
	}
	if len(opened) != 1 {
		t.Errorf("sources opened %d times on restart, want 1", len(opened))
	}

	// A checkpoint survives a restart too, including the safe retry.
	if _, err := s2.Release(context.Background(), "actor-a"); err != nil {
		t.Fatal(err)
	}
	s3 := newStore(t, dir)
	if s3.Bound("actor-a") != nil {
		t.Fatal("binding came back after checkpoint and restart")
	}
	if _, err := s3.Release(context.Background(), "actor-a"); err != nil {
		t.Fatalf("retried checkpoint after restart: %v", err)
	}
}

func TestCorruptStateIsMovedAside(t *testing.T) {
	valid := `{"version":1,"binding":{"identity":{"actor_uid":"actor-a"},"ref":{"class":1,"cgroup_path":"/x"},"op":"run","epoch_unix_nano":5}}`
	for _, tc := range []struct{ name, content string }{
		{"truncated", valid[:len(valid)/2]},
		{"garbage", "\x00\x01not json"},
		{"empty", ""},
		{"unknown version", `{"version":99}`},
		{"invalid identity", strings.Replace(valid, `"actor-a"`, `""`, 1)},
		{"escaping cgroup path", strings.Replace(valid, `"/x"`, `"/../etc"`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, stateFileName)
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			s := newStore(t, dir)
			if s.Bound("actor-a") != nil {
				t.Fatal("bound from a corrupt state file")
			}
			aside, _ := filepath.Glob(p + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files = %v, want one", aside)
			}
			if b, _ := os.ReadFile(aside[0]); string(b) != tc.content {
				t.Errorf("moved-aside content changed")
			}
			// The store works normally afterwards.
			if _, _, err := s.Bind(context.Background(), OpRun, idA, refA); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte(valid), 0o600); err != nil {
			t.Fatal(err)
		}
		if s := newStore(t, dir); s.Bound("actor-a") == nil || s.Bound("actor-a").Identity.ActorUID != "actor-a" {
			t.Fatal("valid state not loaded")
		}
	})
}

func TestHoldLifecycle(t *testing.T) {
	s := newStore(t, "")
	if s.InLifecycle("actor-a") {
		t.Fatal("idle store reports a lifecycle call")
	}
	release := s.HoldLifecycle("actor-a")
	if !s.InLifecycle("actor-a") {
		t.Fatal("held lock not reported")
	}
	release()
}

// TestUnreadableStateIsNotMovedAside: a read error (here: the state path is a
// directory) is not a corrupt file; moving it aside would forget a good
// binding, so the store refuses to start instead.
func TestUnreadableStateIsNotMovedAside(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, stateFileName), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(Config{StateDir: dir}); err == nil {
		t.Fatal("started over an unreadable state file")
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, stateFileName+".corrupt-*")); len(aside) != 0 {
		t.Fatalf("moved aside: %v", aside)
	}
}

// pinnedSource is a source that pinned its sentry by a start time.
type pinnedSource struct {
	source.Source
	ticks uint64
}

func (p pinnedSource) SentryStartTicks() (uint64, bool) { return p.ticks, p.ticks != 0 }
func (pinnedSource) Close() error                       { return nil }

// TestSentryPinPersisted: the start time a source pinned its sentry by at
// Bind is persisted with the binding and handed to the source a restarted
// statsd opens, so that it refuses a pid another process holds by then; a
// launcher's retry (which carries no start time) is still a retry.
func TestSentryPinPersisted(t *testing.T) {
	dir := t.TempDir()
	ref := source.SandboxRef{Class: source.ClassGVisor, SentryPID: 4242}
	var opened []source.SandboxRef
	open := func(r source.SandboxRef) (source.Source, source.HostSampler, error) {
		opened = append(opened, r)
		return pinnedSource{ticks: 777}, nil, nil
	}
	s, err := NewStore(Config{StateDir: dir, Now: fakeClock(), Open: open})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := s.Bind(context.Background(), OpRun, idA, ref)
	if err != nil {
		t.Fatal(err)
	}
	if b.Ref.SentryStartTicks != 777 {
		t.Errorf("bound ref's sentry start = %d, want the pinned 777", b.Ref.SentryStartTicks)
	}
	if again, _, err := s.Bind(context.Background(), OpRun, idA, ref); err != nil || again != b {
		t.Errorf("the launcher's retry: %p, %v; want the same binding %p", again, err, b)
	}
	s.Close()
	if _, err := NewStore(Config{StateDir: dir, Now: fakeClock(), Open: open}); err != nil {
		t.Fatal(err)
	}
	want := []source.SandboxRef{ref, {Class: source.ClassGVisor, SentryPID: 4242, SentryStartTicks: 777}}
	if diff := cmp.Diff(want, opened); diff != "" {
		t.Errorf("refs opened at Bind and at the restart (-want +got):\n%s", diff)
	}
}

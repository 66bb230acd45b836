package hoststat

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: mounting debugfs in a private namespace needs root")
		}
		t.Skip("needs root to mount debugfs in a private mount namespace (run as root, or CI=true to fail)")
	}
}

// TestIntegrationPrivateDebugfsMountLeavesNothing mounts debugfs on a
// locked, discarded thread: inside it debugfs is there, outside the mount
// table is unchanged and the thread is gone afterwards.
func TestIntegrationPrivateDebugfsMountLeavesNothing(t *testing.T) {
	requireRoot(t)
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var inside, onMain bool
	var tid int
	// Repeat: the goroutine sometimes lands on the main thread, which Go
	// never discards and whose mounts /proc/self/mountinfo shows.
	for range 20 {
		if err := inPrivateDebugfs(root, func() {
			tid = unix.Gettid()
			onMain = tid == unix.Getpid()
			inside, _ = isDebugfs(root)
		}); err != nil {
			t.Fatalf("private mount: %v", err)
		}
		if !inside || onMain {
			t.Fatalf("debugfs mounted %v, on the main thread %v", inside, onMain)
		}
		if outside, _ := isDebugfs(root); outside {
			t.Fatal("debugfs visible outside the private thread")
		}
		after, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		if string(before) != string(after) {
			t.Fatalf("mountinfo changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	}
	// The locked thread exits with its goroutine.
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d still alive after the private mount", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIntegrationDebugfsViewOnThisHost reads the real debugfs root for this
// process: whatever the host allows, the view has a state and, unless
// available, a reason; the mount table is unchanged.
func TestIntegrationDebugfsViewOnThisHost(t *testing.T) {
	requireRoot(t)
	before, _ := os.ReadFile("/proc/self/mountinfo")
	s, err := newSampler(source.SandboxRef{VMMPID: os.Getpid()}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	v := s.debugfsView(context.Background(), int32(os.Getpid()))
	t.Logf("debugfs view here: %s %q origin %q", v.State, v.Reason, v.Origin)
	if v.State == source.KVMSourceStateUnspecified ||
		(v.State != source.KVMSourceStateAvailable && v.Reason == "") {
		t.Errorf("debugfs view %v without a reason", v.State)
	}
	if len(v.Counters) != 0 && v.State == source.KVMSourceStateUnavailable {
		for _, c := range v.Counters {
			if c.Kind == source.KVMCounterKindCumulative {
				t.Errorf("unavailable view carries a cumulative counter %s", c.Name)
			}
		}
	}
	after, _ := os.ReadFile("/proc/self/mountinfo")
	if string(before) != string(after) {
		t.Error("mountinfo changed")
	}
	if !strings.Contains(v.Reason+v.Origin, filepath.Join(DefaultDebugfsRoot)) && v.State != source.KVMSourceStateAvailable {
		t.Logf("reason does not name %s: %q", DefaultDebugfsRoot, v.Reason)
	}
}

// TestIntegrationPrivateMountNoteNotInOrigin: a view read through a private
// debugfs mount says so in Reason; Origin stays the kvm path alone, so the
// host mounting debugfs between two samples is not "a new VM".
func TestIntegrationPrivateMountNoteNotInOrigin(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	s, err := newSampler(source.SandboxRef{VMMPID: os.Getpid()}, Config{DebugfsRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	v := s.readDebugfs(int32(os.Getpid()))
	t.Logf("view: %s reason %q origin %q", v.State, v.Reason, v.Origin)
	if strings.Contains(v.Origin, "private") || !strings.HasPrefix(v.Origin, root) {
		t.Errorf("origin %q: want the kvm path under %s alone", v.Origin, root)
	}
	if !strings.Contains(v.Reason, "read through a private debugfs mount") {
		t.Errorf("reason %q: want the private mount note", v.Reason)
	}
}

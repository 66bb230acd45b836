package gvisor

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// TestPinDirHeld: on the real /proc the pinned process's /proc/<pid> is
// held after the first read whose start times were the pin, and later reads
// of its net/dev go through it; once the process exits (a zombie, then
// reaped) the read says it is gone and nothing stays held. Another start
// time holds nothing; neither does a fake /proc.
func TestPinDirHeld(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	want, err := process.StartTime("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join("/proc", strconv.Itoa(pid), "net", "dev")

	other := newPinDir()
	if _, err := snapNetDev(other, "/proc", pid, want+1, p); !errors.Is(err, errPidChanged) || other.fd != -1 {
		t.Fatalf("another pin: %v, held fd %d; want errPidChanged, nothing held", err, other.fd)
	}

	pd := newPinDir()
	defer pd.close()
	for i := range 3 {
		if b, err := snapNetDev(pd, "/proc", pid, want, p); err != nil || len(b) == 0 || pd.fd < 0 {
			t.Fatalf("read %d: %d bytes, %v, held fd %d; want net/dev, held", i, len(b), err, pd.fd)
		}
	}
	cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = snapNetDev(pd, "/proc", pid, want, p)
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !process.IsGone(err) || errors.Is(err, errNoNetDev) || pd.fd != -1 {
		t.Fatalf("exited: %v, held fd %d; want gone (not errNoNetDev), nothing held", err, pd.fd)
	}
	cmd.Wait()
	if _, err := snapNetDev(pd, "/proc", pid, want, p); !process.IsGone(err) || errors.Is(err, errNoNetDev) {
		t.Fatalf("reaped: %v, want gone", err)
	}

	proc := t.TempDir()
	writeStat(t, proc, 42, 5000)
	writeFile(t, filepath.Join(proc, "42", "net", "dev"), netDevHeader)
	fake := newPinDir()
	if _, err := snapNetDev(fake, proc, 42, 5000, filepath.Join(proc, "42", "net", "dev")); err != nil || fake.fd != -1 {
		t.Fatalf("a fake /proc: %v, held fd %d; want nothing held", err, fake.fd)
	}
}

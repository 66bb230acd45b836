package gvisor

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// TestPinStatHeld: on the real /proc the pinned process's stat is held
// after the first read that gave the pinned start time, later reads go
// through it, and once the process exits (a zombie, then reaped) the reads
// say it is gone and nothing stays held. A start time that is not the pin
// holds nothing; neither does a fake /proc.
func TestPinStatHeld(t *testing.T) {
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

	other := newPinStat()
	if got, err := other.start("/proc", pid, want+1); err != nil || got != want || other.fd != -1 {
		t.Fatalf("another pin: start %d, %v, held fd %d; want %d, nothing held", got, err, other.fd, want)
	}

	ps := newPinStat()
	defer ps.close()
	for i := range 3 {
		if got, err := ps.start("/proc", pid, want); err != nil || got != want || ps.fd < 0 {
			t.Fatalf("read %d: start %d, %v, held fd %d; want %d, held", i, got, err, ps.fd, want)
		}
	}
	held := ps.fd
	cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = ps.start("/proc", pid, want)
		if process.IsGone(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(err, process.ErrExited) || ps.fd != -1 {
		t.Fatalf("a zombie: %v, held fd %d (was %d); want ErrExited, nothing held", err, ps.fd, held)
	}
	cmd.Wait()
	if _, err := ps.start("/proc", pid, want); !process.IsGone(err) {
		t.Fatalf("reaped: %v, want gone", err)
	}

	proc := t.TempDir()
	writeStat(t, proc, 42, 5000)
	fake := newPinStat()
	if got, err := fake.start(proc, 42, 5000); err != nil || got != 5000 || fake.fd != -1 {
		t.Fatalf("a fake /proc: start %d, %v, held fd %d; want 5000, nothing held", got, err, fake.fd)
	}
	writeStat(t, proc, 42, 9999)
	if got, _ := fake.start(proc, 42, 5000); got != 9999 {
		t.Fatalf("a fake /proc rewritten: start %d, want 9999", got)
	}
}

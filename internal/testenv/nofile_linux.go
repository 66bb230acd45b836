package testenv

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// ExhaustDescriptors fills this process's descriptor table, under an
// RLIMIT_NOFILE lowered to at most 512, until opening a file fails with
// EMFILE, and returns the function that closes those files and restores the
// limit (also run at the cleanup; running it twice is harmless). In between
// any open, socket or accept of the process fails: keep it short.
func ExhaustDescriptors(t testing.TB) (release func()) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	low := rl
	low.Cur = min(rl.Cur, 512)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	release = func() {
		if held == nil {
			return
		}
		for _, f := range held {
			f.Close()
		}
		held = nil
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(release)
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				release()
				t.Fatalf("filling the descriptor table: %v", err)
			}
			return release
		}
		held = append(held, f)
	}
}

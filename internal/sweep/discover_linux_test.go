package sweep

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestDiscoverAtDescriptorLimit: at the descriptor limit the socket
// directory cannot be opened. filepath.Glob dropped that error (EMFILE):
// a sweep saw zero daemons and /healthz said ok. Discovery now fails with
// the directory's error.
func TestDiscoverAtDescriptorLimit(t *testing.T) {
	dir := t.TempDir()
	statsdfake.Start(t, filepath.Join(dir, "a.sock"))
	pattern := filepath.Join(dir, "*.sock")
	if got, err := Discover(pattern); err != nil || len(got) != 1 {
		t.Fatalf("Discover = %q, %v before the limit", got, err)
	}

	release := testenv.ExhaustDescriptors(t)
	got, err := Discover(pattern)
	release()
	t.Logf("at the limit: Discover = %q, %v", got, err)
	if !errors.Is(err, syscall.EMFILE) {
		t.Errorf("Discover at the descriptor limit = %q, %v; want an error wrapping EMFILE", got, err)
	}
}

// TestGlob: the glob matches as filepath.Glob does, and a directory that
// is missing or not a directory matches nothing (no error).
func TestGlob(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"a/x.sock", "a/y.sock", "a/z.txt", "b/x.sock", "file"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, pattern := range []string{
		"a/*.sock",
		"*/x.sock",
		"*/*",
		"a/x.sock",
		"a/none.sock",
		"missing/*.sock",
		"file/*.sock",
		"[ab]/?.sock",
		"*",
	} {
		t.Run(pattern, func(t *testing.T) {
			want, err := filepath.Glob(filepath.Join(dir, pattern))
			if err != nil {
				t.Fatal(err)
			}
			got, err := glob(filepath.Join(dir, pattern))
			if err != nil {
				t.Fatalf("glob: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("glob (-filepath.Glob +glob):\n%s", diff)
			}
		})
	}
	if _, err := glob(filepath.Join(dir, "[")); !errors.Is(err, filepath.ErrBadPattern) {
		t.Errorf("glob of a bad pattern: %v, want ErrBadPattern", err)
	}
}

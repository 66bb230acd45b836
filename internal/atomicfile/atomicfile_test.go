package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	for _, content := range []string{"first", "second"} {
		if err := Write(dir, "state.json", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "state.json"))
		if err != nil || string(got) != content {
			t.Fatalf("content = %q, %v; want %q", got, err, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("dir holds %d entries, want only the state file", len(entries))
	}
	if fi, _ := os.Stat(filepath.Join(dir, "state.json")); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestMoveAside(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	os.WriteFile(p, []byte("garbage"), 0o600)
	aside, err := MoveAside(p, 42)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(aside); string(b) != "garbage" || filepath.Base(aside) != "state.json.corrupt-42" {
		t.Fatalf("moved to %s with %q", aside, b)
	}
}

func TestSweepTemps(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"binding.json.tmp-1", "drift.json.tmp-22", "binding.json", "drift.json.corrupt-5", "other.tmp-3", "binding.jsonx.tmp-4"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	os.Mkdir(filepath.Join(dir, "drift.json.tmp-dir"), 0o700) // not a regular file: kept
	removed, err := SweepTemps(dir, "binding.json", "drift.json")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range removed {
		got = append(got, filepath.Base(p))
	}
	if diff := cmp.Diff([]string{"binding.json.tmp-1", "drift.json.tmp-22"}, got); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 5 {
		t.Errorf("%d entries left, want 5", len(left))
	}
}

package testenv

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the -update flag of every test binary that links testenv:
// Golden rewrites the golden files instead of comparing with them.
var update = flag.Bool("update", false, "rewrite the golden files (testdata/*.golden)")

// Golden compares got with testdata/<name>.golden, or writes it there
// under go test -update. The one golden-file helper of the tests.
func Golden(t testing.TB, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("output differs from %s (-want +got; go test -update rewrites it):\n%s", p, d)
	}
}

package testenv

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// CLICase is one command line of a binary (its arguments) and the exit
// status it must end with.
type CLICase struct {
	Name string
	Args []string
	Code int
}

// GoldenCLI runs each case through run (a binary's main less os.Exit) and
// holds what it printed, after a "$ prog args" line, stdout then stderr, to
// testdata/<name>.golden, and its exit status to the case's.
func GoldenCLI(t *testing.T, prog string, cases []CLICase, run func(args []string, stdout, stderr io.Writer) int) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(tc.Args, &out, &errOut); code != tc.Code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.Code, errOut.String())
			}
			Golden(t, tc.Name, []byte("$ "+prog+" "+strings.Join(tc.Args, " ")+"\n"+out.String()+errOut.String()))
		})
	}
}

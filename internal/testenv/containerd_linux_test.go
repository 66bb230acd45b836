package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRuntimeList reads the container ids of a runc root (a directory per
// container) and a runsc root (<sandbox>_sandbox:<container>.state and
// .lock files), as the cleanup does when containerd is gone.
func TestRuntimeList(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dirs  []string
		files []string
		want  []string
	}{
		{name: "runc", dirs: []string{"aaa", "bbb"}, want: []string{"aaa", "bbb"}},
		{name: "runsc", files: []string{"aaa_sandbox:aaa.state", "aaa_sandbox:aaa.lock", "aaa_sandbox:ccc.state"}, want: []string{"aaa", "ccc"}},
		{name: "empty"},
		{name: "missing", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.name == "missing" {
				root = filepath.Join(root, "absent")
			}
			for _, d := range tc.dirs {
				if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, runtimeList(root)); diff != "" {
				t.Errorf("runtimeList (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUnescapeMountPath undoes mountinfo's octal escapes.
func TestUnescapeMountPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`/tmp/ctrd-1/state/shm`, "/tmp/ctrd-1/state/shm"},
		{`/tmp/a\040b`, "/tmp/a b"},
		{`/tmp/tab\011x\134y`, "/tmp/tab\tx\\y"},
		{`/tmp/short\04`, `/tmp/short\04`},
	} {
		if got := unescapeMountPath(tc.in); got != tc.want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOwnDir: own-dir makes a directory, or takes one the kubelet made,
// and gives it to the uid with the mode; a symbolic link, a file and a bad
// flag are refused.
func TestOwnDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another uid needs root")
	}
	root := t.TempDir()
	existing := filepath.Join(root, "statsagent")
	if err := os.Mkdir(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(root, "otelcol")
	link := filepath.Join(root, "link")
	if err := os.Symlink(existing, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		dirs []string
		err  string
	}{
		{name: "made and taken", args: []string{"--owner", "65532:65533", "--dir", existing, "--dir", missing}, code: exitOK, dirs: []string{existing, missing}},
		{name: "again", args: []string{"--owner", "65532:65533", "--dir", existing}, code: exitOK, dirs: []string{existing}},
		{name: "symlink", args: []string{"--owner", "65532", "--dir", link}, code: exitError, err: "symbolic link"},
		{name: "file", args: []string{"--owner", "65532", "--dir", file}, code: exitError, err: "not a directory"},
		{name: "no owner", args: []string{"--dir", existing}, code: exitUsage, err: "--owner"},
		{name: "named owner", args: []string{"--owner", "nobody", "--dir", existing}, code: exitUsage, err: "numeric"},
		{name: "bad mode", args: []string{"--owner", "1", "--mode", "9", "--dir", existing}, code: exitUsage, err: "--mode"},
		{name: "no dir", args: []string{"--owner", "1"}, code: exitUsage, err: "no --dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"own-dir"}, tc.args...), &out, &errOut)
			if code != tc.code || !strings.Contains(errOut.String(), tc.err) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut.String(), tc.code, tc.err)
			}
			for _, d := range tc.dirs {
				fi, err := os.Lstat(d)
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if !fi.IsDir() || fi.Mode().Perm() != 0o700 || st.Uid != 65532 || st.Gid != 65533 {
					t.Errorf("%s: %v uid %d gid %d; want a directory 0700 of 65532:65533", d, fi.Mode(), st.Uid, st.Gid)
				}
			}
		})
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the symbolic link was changed: %v %v", fi, err)
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
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
		{name: "symlink", args: []string{"--owner", "65532", "--dir", link}, code: exitError, err: "a symbolic link, refused"},
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
			checkOwned(t, tc.dirs, 65532, 65533)
		})
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the symbolic link was changed: %v %v", fi, err)
	}
}

// ownDirChildEnv names the arguments of own-dir when the test binary is
// re-executed by TestOwnDirChownOnly: the child runs the command and exits.
const ownDirChildEnv = "STATSCTL_TEST_OWNDIR_ARGS"

// TestOwnDirChownOnly: with CAP_CHOWN alone, as the DaemonSet's init
// container runs, own-dir takes the kubelet's directory, succeeds again on
// the next pod start (the directory is then 65532's, 0700), mends a wrong
// mode, and still refuses a symbolic link. The test binary is re-executed
// under setpriv with a bounding set of CAP_CHOWN alone.
func TestOwnDirChownOnly(t *testing.T) {
	if args, ok := os.LookupEnv(ownDirChildEnv); ok {
		status, err := os.ReadFile("/proc/self/status")
		if err != nil || !strings.Contains(string(status), "\nCapEff:\t0000000000000001\n") {
			fmt.Fprintf(os.Stderr, "child: want CapEff CAP_CHOWN alone: %v\n%s", err, status)
			os.Exit(99)
		}
		os.Exit(run(context.Background(), append([]string{"own-dir"}, strings.Fields(args)...), os.Stdout, os.Stderr))
	}
	if os.Geteuid() != 0 {
		t.Skip("chown to another uid needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("setpriv (util-linux) is needed: %v", err)
		}
		t.Skip("no setpriv")
	}
	root := t.TempDir()
	kubelet := filepath.Join(root, "statsagent")
	if err := os.Mkdir(kubelet, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(root, "otelcol")
	wrongMode := filepath.Join(root, "wrongmode")
	if err := os.Mkdir(wrongMode, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(wrongMode, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(kubelet, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dirs []string
		code int
		err  string
	}{
		{name: "first pod", dirs: []string{kubelet, missing}, code: exitOK},
		{name: "second pod", dirs: []string{kubelet, missing}, code: exitOK},
		{name: "wrong mode", dirs: []string{wrongMode}, code: exitOK},
		{name: "symlink", dirs: []string{link}, code: exitError, err: "a symbolic link, refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--owner=65532:65532"}
			for _, d := range tc.dirs {
				args = append(args, "--dir="+d)
			}
			cmd := exec.Command(setpriv, "--bounding-set", "-all,+chown", "--", os.Args[0], "-test.run=^TestOwnDirChownOnly$")
			cmd.Env = append(os.Environ(), ownDirChildEnv+"="+strings.Join(args, " "))
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			if code != tc.code || !strings.Contains(errOut.String(), tc.err) {
				t.Fatalf("exit %d (%v), stderr %q; want %d and %q", code, err, errOut.String(), tc.code, tc.err)
			}
			if tc.code != exitOK {
				return
			}
			checkOwned(t, tc.dirs, 65532, 65532)
		})
	}
}

// checkOwned fails unless each of dirs is a directory of uid:gid, 0700.
func checkOwned(t *testing.T, dirs []string, uid, gid uint32) {
	t.Helper()
	for _, d := range dirs {
		fi, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: %v uid %d gid %d; want a directory 0700 of %d:%d", d, fi.Mode(), st.Uid, st.Gid, uid, gid)
		}
	}
}

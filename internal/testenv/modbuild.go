package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// moduleBuild is one test binary built from a module of its own, once per
// test process.
type moduleBuild struct {
	sync.Mutex
	path string
}

// get returns the binary name built from module (see buildModule), or
// PrebuiltBinEnv's name when that names a directory; what names it in a
// skip or failure.
func (m *moduleBuild) get(t testing.TB, module, name, what string) string {
	t.Helper()
	if dir := os.Getenv(PrebuiltBinEnv); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", PrebuiltBinEnv, dir, err)
		}
		return p
	}
	m.Lock()
	defer m.Unlock()
	if m.path != "" {
		if _, err := os.Stat(m.path); err == nil {
			return m.path
		}
	}
	goCmd, err := exec.LookPath("go")
	Need(t, err == nil, fmt.Sprintf("no go command on PATH: %s (%s) is built with it", what, module))
	p, err := buildModule(goCmd, module, name)
	Need(t, err == nil, fmt.Sprintf("building %s failed: %v", what, err))
	m.path = p
	return p
}

// buildModule builds the main package of module (a directory of the
// repository holding a module of its own, such as e2e/otelcol) as a binary
// named name and returns its path: os.TempDir()/sandboxstats-<name>-<key>/<name>,
// the key a hash of the module's go.mod, go.sum and Go files, the Go version
// and platform, so that later test processes and packages reuse it, one
// build at a time (a lock file in that directory). Such directories unused
// for a day are removed.
func buildModule(goCmd, module, name string) (string, error) {
	modDir, err := moduleDir(goCmd, module)
	if err != nil {
		return "", err
	}
	key, err := moduleKey(modDir)
	if err != nil {
		return "", err
	}
	p, err := buildModuleAt(modDir, filepath.Join(os.TempDir(), "sandboxstats-"+name+"-"+key), name)
	if err != nil {
		return "", err
	}
	pruneModuleBuilds(filepath.Dir(p), name, 24*time.Hour)
	return p, nil
}

// moduleDir finds module: relative to this source file when its path is
// known (go test builds from source), else to the main module's go.mod
// (`go env GOMOD` in the test's working directory).
func moduleDir(goCmd, module string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "..", "..", filepath.FromSlash(module))
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	out, err := exec.Command(goCmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("%s: not inside the sandboxstats module (go env GOMOD is empty)", module)
	}
	dir := filepath.Join(filepath.Dir(gomod), filepath.FromSlash(module))
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("the module %s: %w", module, err)
	}
	return dir, nil
}

// moduleKey hashes what a module's binary is built from: its go.mod,
// go.sum and Go files (names and contents), the Go version and the
// platform (and how it is built: as the images' binaries are).
func moduleKey(modDir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s static trimpath\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	err := filepath.WalkDir(modDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() || !(name == "go.mod" || name == "go.sum" || strings.HasSuffix(name, ".go")) {
			return nil
		}
		b, err := bounded.ReadFile(path, bounded.MaxFileBytes)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(modDir, path)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("the sources in %s: %w", modDir, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// buildModuleAt returns dir/name, building it first unless it exists.
// An exclusive lock on dir/.lock serialises builds across processes; the
// binary is built beside its final name and renamed into place, so it is
// never seen half written.
func buildModuleAt(modDir, dir, name string) (string, error) {
	bin := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The directory's name is predictable in a shared directory: use it only
	// if it is a directory of this user's, not a symlink.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || (ok && int(st.Uid) != os.Geteuid()) {
		return "", fmt.Errorf("%s: not a directory of uid %d", dir, os.Geteuid())
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now) // marks it used for pruneModuleBuilds
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil { // another process built it meanwhile
		return bin, nil
	}
	tmp := bin + ".tmp" + strconv.Itoa(os.Getpid())
	// Built as the images' binaries are (static, -trimpath): the compiled
	// packages in Go's build cache serve both (the otelcol image's).
	if err := ociimage.GoBuild(context.Background(), modDir, tmp, "."); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return bin, nil
}

// pruneModuleBuilds removes the other sandboxstats-<name>-* directories
// beside keep that were last used more than age ago.
func pruneModuleBuilds(keep, name string, age time.Duration) {
	old, _ := filepath.Glob(filepath.Join(filepath.Dir(keep), "sandboxstats-"+name+"-*"))
	for _, d := range old {
		if fi, err := os.Stat(d); err == nil && d != keep && fi.IsDir() && time.Since(fi.ModTime()) > age {
			os.RemoveAll(d)
		}
	}
}

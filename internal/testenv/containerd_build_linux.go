package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The versions BuildContainerd builds: the only place they are pinned.
const (
	// ContainerdVersion is the containerd (containerd, containerd-shim-runc-v2,
	// ctr) of github.com/containerd/containerd/v2.
	ContainerdVersion = "v2.4.2"
	// RuncVersion is github.com/opencontainers/runc's.
	RuncVersion = "v1.5.3"
	// CriToolsVersion is crictl's, sigs.k8s.io/cri-tools.
	CriToolsVersion = "v1.37.0"
	// containerdTags leave out the snapshotters that need kernel features or
	// libraries this host lacks.
	containerdTags = "no_btrfs no_devmapper no_zfs"
)

// ContainerdBins are the binaries BuildContainerd built, all in Dir.
type ContainerdBins struct {
	Dir        string
	Containerd string // containerd
	Shim       string // containerd-shim-runc-v2
	Ctr        string // ctr
	Runc       string // runc
	Crictl     string // crictl
}

// containerdBuild is BuildContainerd's result in this process.
var containerdBuild struct {
	sync.Mutex
	bins *ContainerdBins
}

// containerdBinDir is the directory, under os.TempDir, holding the binaries
// of these versions built by this Go toolchain: the cache every test process
// shares.
func containerdBinDir() string {
	h := sha256.Sum256([]byte(strings.Join([]string{ContainerdVersion, RuncVersion, CriToolsVersion,
		containerdTags, runtime.Version(), runtime.GOARCH}, "\n")))
	return filepath.Join(os.TempDir(), "sandboxstats-containerd-"+hex.EncodeToString(h[:6]))
}

func binsIn(dir string) *ContainerdBins {
	return &ContainerdBins{
		Dir:        dir,
		Containerd: filepath.Join(dir, "containerd"),
		Shim:       filepath.Join(dir, "containerd-shim-runc-v2"),
		Ctr:        filepath.Join(dir, "ctr"),
		Runc:       filepath.Join(dir, "runc"),
		Crictl:     filepath.Join(dir, "crictl"),
	}
}

// complete reports whether every binary is there.
func (b *ContainerdBins) complete() bool {
	for _, p := range []string{b.Containerd, b.Shim, b.Ctr, b.Runc, b.Crictl} {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// BuildContainerd returns containerd, its runc shim, ctr, runc and crictl
// at the pinned versions (ContainerdVersion, RuncVersion, CriToolsVersion),
// building them with `go install` from the Go module proxy the first time.
// The binaries are kept in a directory under os.TempDir named after the
// versions and the Go toolchain, shared by every test process (a file lock
// serialises the build) and never removed by a test: a later run finds them
// built. A cold build (empty module and build caches) took 6 to 7.5 minutes
// on a loaded 2-core machine, about 4.5 minutes of CPU; with a warm Go build
// cache it is a relink, about 10 s; found in the cache, nothing.
func BuildContainerd(t testing.TB) *ContainerdBins {
	t.Helper()
	containerdBuild.Lock()
	defer containerdBuild.Unlock()
	if containerdBuild.bins != nil {
		return containerdBuild.bins
	}
	if !binsIn(containerdBinDir()).complete() {
		_, err := exec.LookPath("gcc")
		Need(t, err == nil, "building runc needs a C compiler (apt-get install gcc libc6-dev)")
	}
	start := time.Now()
	bins, built, err := buildContainerd(goTool(t), containerdBinDir())
	if err != nil {
		t.Fatal(err)
	}
	if built {
		t.Logf("built containerd %s, runc %s, crictl %s into %s in %v", ContainerdVersion, RuncVersion, CriToolsVersion,
			bins.Dir, time.Since(start).Round(100*time.Millisecond))
	}
	containerdBuild.bins = bins
	return bins
}

// buildContainerd builds the binaries into dir unless they are there already
// (built reports whether it built them), holding dir+".lock" meanwhile: it
// builds into a new directory beside dir and renames it to dir when every
// build succeeded, so dir is complete or absent.
func buildContainerd(goBin, dir string) (bins *ContainerdBins, built bool, err error) {
	bins = binsIn(dir)
	if bins.complete() {
		return bins, false, nil
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("containerd build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, false, fmt.Errorf("flock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if bins.complete() { // another process built them meanwhile
		return bins, false, nil
	}
	if err := os.RemoveAll(dir); err != nil { // an incomplete leftover
		return nil, false, fmt.Errorf("remove %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".build-")
	if err != nil {
		return nil, false, fmt.Errorf("containerd build directory: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, false, fmt.Errorf("containerd build directory: %w", err)
	}
	installs := []struct {
		env  []string
		args []string
	}{
		{nil, []string{"-tags", containerdTags,
			"github.com/containerd/containerd/v2/cmd/containerd@" + ContainerdVersion,
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@" + ContainerdVersion,
			"github.com/containerd/containerd/v2/cmd/ctr@" + ContainerdVersion}},
		{[]string{"CGO_ENABLED=1"}, []string{"github.com/opencontainers/runc@" + RuncVersion}}, // runc's nsenter is C
		{nil, []string{"sigs.k8s.io/cri-tools/cmd/crictl@" + CriToolsVersion}},
	}
	errs := make([]error, len(installs))
	var wg sync.WaitGroup
	for i, in := range installs {
		wg.Go(func() {
			cmd := exec.Command(goBin, append([]string{"install"}, in.args...)...)
			// Outside any module and workspace: GOFLAGS=-mod=mod keeps a
			// -mod=vendor or readonly of the caller's environment away.
			cmd.Dir = tmp
			cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false")
			cmd.Env = append(cmd.Env, in.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go install %s: %w\n%s", strings.Join(in.args, " "), err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	if !binsIn(tmp).complete() {
		return nil, false, fmt.Errorf("go install into %s: a binary is missing", tmp)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, false, fmt.Errorf("rename %s to %s: %w", tmp, dir, err)
	}
	return bins, true, nil
}

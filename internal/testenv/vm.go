package testenv

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The VM lane: real-kernel tests that need a pure cgroup v2 host (or a real
// AF_VSOCK, which must never be opened on the host) run as the very same
// compiled test binaries inside a Debian cloud kernel under QEMU TCG with
// cgroup_no_v1=all. The guest's serial console carries the test binaries'
// -test.v output back; VMLane.Run reports it as one subtest per test.

// PrebuiltBinEnv names a directory holding statsd, statsctl and statsagent
// built already: BuildBinaries returns it instead of running `go build` (the
// VM lane's guest has no Go toolchain).
const PrebuiltBinEnv = "SANDBOXSTATS_BIN_DIR"

// VMDiskEnv is set in the guest to the virtio disk's device when
// VMLane.DiskBytes attached one.
const VMDiskEnv = "SANDBOXSTATS_VM_DISK"

// Guest paths of what VMLane puts in the initramfs.
const (
	vmBinDir   = "/usr/local/bin"
	vmTestDir  = "/sbstest"
	vmModDir   = "/sbstest/modules"
	vmDiskName = "/dev/vda"
)

// VMKernel is a Debian cloud kernel (linux-image-cloud-amd64) on this
// machine: its image and its modules directory.
type VMKernel struct {
	Image, Modules string
}

// NeedVM checks the VM lane's prerequisites (root, qemu-system-x86_64, the
// Debian cloud kernel with its modules, a static busybox) and returns the
// kernel.
func NeedVM(t testing.TB) VMKernel {
	t.Helper()
	NeedQEMU(t)
	Need(t, BusyboxStatic() != "", "the VM lane's init is a static busybox: apt-get install busybox-static")
	images, _ := filepath.Glob("/boot/vmlinuz-*-cloud-amd64")
	sort.Strings(images)
	for i := len(images) - 1; i >= 0; i-- {
		ver := strings.TrimPrefix(filepath.Base(images[i]), "vmlinuz-")
		mods := filepath.Join("/lib/modules", ver)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err == nil {
			return VMKernel{Image: images[i], Modules: mods}
		}
	}
	Need(t, false, "the VM lane boots Debian's cloud kernel: apt-get install -y --no-install-recommends linux-image-cloud-amd64")
	return VMKernel{}
}

// VMRun is one test binary the guest runs.
type VMRun struct {
	// Name names the run in the subtests' names ("gvisor/TestX").
	Name string
	// Binary is the host path of a test binary built static (BuildTestBinary).
	Binary string
	// Tests are the top-level tests it runs (-test.run '^(A|B)$'); each is
	// one subtest of VMLane.Run, failed when the guest never ran it.
	Tests []string
	// Timeout is the binary's -test.timeout in the guest (default 5m).
	Timeout time.Duration
}

// VMLane is one boot of the guest: the kernel, what the initramfs holds
// besides busybox and the runs, and the bounds.
type VMLane struct {
	Kernel VMKernel
	// Modules are loaded (with their dependencies, from modules.dep) before
	// the runs, e.g. "virtio_blk", "vsock_loopback".
	Modules []string
	// Files are copied into the initramfs: guest path -> host path (mode
	// kept). The statsd binaries belong in PrebuiltBinEnv's directory,
	// /usr/local/bin, which the guest's PATH and PrebuiltBinEnv name.
	Files map[string]string
	// Env is added to the runs' environment (CI is passed on as it is here).
	Env []string
	// DiskBytes, when positive, attaches a raw virtio disk of that size
	// (sparse, in the test's temporary directory), /dev/vda in the guest
	// (VMDiskEnv); it needs the virtio_pci and virtio_blk modules.
	DiskBytes int64
	// Stage2, when set, replaces the guest's second stage after its mounts
	// (the module loads and the runs): for tests of the lane itself.
	Stage2 string
	// MemoryMiB is the guest's memory (default 3072); it has 2 vCPUs.
	MemoryMiB int
	// Timeout bounds the whole boot: QEMU is killed then (default 8m).
	Timeout time.Duration
	Runs    []VMRun
}

// BuildTestBinary compiles the tests of the module's package pkg (e.g.
// "internal/gvisor") with `go test -c`, static so that they run in a guest
// with no libraries, into dir and returns the path. -trimpath, as the
// images' binaries are built: the packages they share come from Go's build
// cache.
func BuildTestBinary(t testing.TB, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".test")
	cmd := exec.Command(goTool(t), "test", "-c", "-trimpath", "-ldflags=-s -w", "-o", out, module+"/"+pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, b)
	}
	return out
}

// BuildStaticBinaries builds statsd, statsctl and statsagent static into
// dir (for a guest's PrebuiltBinEnv), -trimpath as the images' binaries
// are (internal/ociimage.GoBuild): their compiled packages in Go's build
// cache serve both.
func BuildStaticBinaries(t testing.TB, dir string) {
	t.Helper()
	goBuild(t, dir, []string{"CGO_ENABLED=0"}, []string{"-trimpath", "-ldflags=-s -w"}, "statsd", "statsctl", "statsagent")
}

// VMResult is what the guest said of one test.
type VMResult struct {
	Status string // "PASS", "FAIL", "SKIP"; "" when it never finished
	Dur    string // as the test binary printed it, "(1.50s)"
	Out    []string
}

// VMBoot is how one boot of the guest went.
type VMBoot struct {
	Results map[string]*VMResult // by "<run>/<test>", one for each planned test
	Exits   map[string]string    // each run's exit status as its shell said it ("0"); absent: it never ended
	Why     string               // "done", or why the guest ended early
	Took    time.Duration
	Tail    string // the last serial lines
}

// Run boots the guest, runs every VMRun in it and reports each of their tests
// as a subtest "<run>/<test>": passed, failed with the test's own output, or
// failed because the guest never ran or finished it (the last serial lines
// and why: the deadline, a kernel panic, a run that exited). Skipped tests
// skip (fail under CI=true, as Need does).
func (l VMLane) Run(t *testing.T) {
	t.Helper()
	b := l.Boot(t)
	t.Logf("guest: %s in %v (%s)", l.Kernel.Image, b.Took, b.Why)
	for _, r := range l.Runs {
		// A binary that exits non-zero after its tests passed (TestMain, a
		// panic or -test.timeout after the last PASS) fails too.
		if code, ok := b.Exits[r.Name]; ok && code != "0" {
			t.Run(r.Name+"/exit", func(t *testing.T) {
				t.Errorf("%s.test exited with status %s; the last serial lines:\n%s", r.Name, code, b.Tail)
			})
		}
		for _, name := range r.Tests {
			res := b.Results[r.Name+"/"+name]
			t.Run(r.Name+"/"+name, func(t *testing.T) {
				body := strings.Join(res.Out, "\n")
				switch res.Status {
				case "PASS":
					t.Logf("passed in the guest %s:\n%s", res.Dur, body)
				case "SKIP":
					Need(t, false, "skipped in the guest: "+body)
				case "FAIL":
					t.Errorf("failed in the guest %s:\n%s", res.Dur, body)
				default:
					t.Errorf("the guest did not finish this test (%s); its output:\n%s\nthe last serial lines:\n%s", b.Why, body, b.Tail)
				}
			})
		}
	}
}

// Boot boots the guest once and returns what it said, without judging it:
// QEMU is killed at l.Timeout, and 2 s after the guest's kernel panics.
func (l VMLane) Boot(t testing.TB) VMBoot {
	t.Helper()
	if l.MemoryMiB == 0 {
		l.MemoryMiB = 3072
	}
	if l.Timeout == 0 {
		l.Timeout = 8 * time.Minute
	}
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := l.writeInitramfs(initrd); err != nil {
		t.Fatalf("assembling the initramfs: %v", err)
	}
	if st, err := os.Stat(initrd); err == nil {
		t.Logf("initramfs: %.1f MiB", float64(st.Size())/(1<<20))
	}
	args := []string{"-accel", "tcg", "-cpu", "max", "-m", strconv.Itoa(l.MemoryMiB), "-smp", "2",
		"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", l.Kernel.Image, "-initrd", initrd,
		"-append", "console=ttyS0 quiet loglevel=1 panic=-1 cgroup_no_v1=all " + VMLaneMarker}
	if l.DiskBytes > 0 {
		disk := filepath.Join(dir, "disk.raw")
		f, err := os.Create(disk)
		if err == nil {
			err = f.Truncate(l.DiskBytes)
			f.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-drive", "file="+disk+",if=virtio,format=raw")
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, NeedQEMU(t), args...)
	cmd.WaitDelay = 5 * time.Second
	var stderr SyncBuffer
	cmd.Stderr = &stderr
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("qemu: %v", err)
	}
	p := newVMParser(l.Runs)
	var wg sync.WaitGroup
	wg.Go(func() {
		p.consume(pr, func() {
			time.AfterFunc(2*time.Second, cancel) // let the panic's lines arrive
		})
	})
	werr := cmd.Wait()
	pw.Close()
	wg.Wait()
	return VMBoot{Results: p.results, Exits: p.exits, Why: p.why(ctx.Err() != nil, l.Timeout, werr, stderr.String()),
		Took: time.Since(start).Round(100 * time.Millisecond), Tail: p.tail()}
}

package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
// with no libraries, into dir and returns the path.
func BuildTestBinary(t testing.TB, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".test")
	cmd := exec.Command(goTool(t), "test", "-c", "-ldflags=-s -w", "-o", out, module+"/"+pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, b)
	}
	return out
}

// BuildStaticBinaries builds statsd, statsctl and statsagent static into
// dir (for a guest's PrebuiltBinEnv).
func BuildStaticBinaries(t testing.TB, dir string) {
	t.Helper()
	goBuild(t, dir, []string{"CGO_ENABLED=0"}, []string{"-ldflags=-s -w"}, "statsd", "statsctl", "statsagent")
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

// why says how the guest ended.
func (p *vmParser) why(timedOut bool, limit time.Duration, werr error, stderr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.panicked:
		return "the guest kernel panicked"
	case timedOut:
		return fmt.Sprintf("killed at the %v deadline", limit)
	case !p.done:
		return fmt.Sprintf("QEMU exited before the guest was done: %v %s", werr, strings.TrimSpace(stderr))
	}
	return "done"
}

func (l VMLane) writeInitramfs(dst string) error {
	fs := newInitramfs()
	bb := BusyboxStatic()
	fs.copyFile("/bin/busybox", bb, 0o755)
	fs.symlink("/bin/sh", "busybox")
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp", "/run", "/root", "/newroot", vmBinDir} {
		fs.mkdir(d)
	}
	fs.writeFile("/init", []byte(vmInit), 0o755)
	for guest, host := range l.Files {
		st, err := os.Stat(host)
		if err != nil {
			return err
		}
		fs.copyFile(guest, host, uint32(st.Mode().Perm()))
	}
	mods, err := moduleOrder(l.Kernel.Modules, l.Modules)
	if err != nil {
		return err
	}
	var script strings.Builder
	script.WriteString("#!/bin/sh\n# written by testenv.VMLane: the guest's second stage\n")
	script.WriteString(vmInit2)
	if l.Stage2 != "" {
		script.WriteString(l.Stage2)
		fs.writeFile("/init2", []byte(script.String()), 0o755)
		return fs.writeTo(dst)
	}
	for i, m := range mods {
		g := fmt.Sprintf("%s/%02d-%s", vmModDir, i, filepath.Base(m))
		fs.copyFile(g, filepath.Join(l.Kernel.Modules, m), 0o644)
		fmt.Fprintf(&script, "insmod %s || echo 'SBSVM-WARN insmod %s failed'\n", g, m)
	}
	env := []string{PrebuiltBinEnv + "=" + vmBinDir, "HOME=/root", "PATH=" + vmBinDir + ":/usr/bin:/bin:/usr/sbin:/sbin"}
	if ci := os.Getenv("CI"); ci != "" {
		env = append(env, "CI="+ci)
	}
	if l.DiskBytes > 0 {
		env = append(env, VMDiskEnv+"="+vmDiskName)
	}
	for _, e := range append(env, l.Env...) {
		fmt.Fprintf(&script, "export %s\n", shellQuote(e))
	}
	script.WriteString("echo SBSVM-READY $(cat /sys/fs/cgroup/cgroup.subtree_control)\n")
	for _, r := range l.Runs {
		bin := vmTestDir + "/" + r.Name + ".test"
		fs.copyFile(bin, r.Binary, 0o755)
		timeout := r.Timeout
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		re := "^(" + strings.Join(r.Tests, "|") + ")$"
		fmt.Fprintf(&script, "echo SBSVM-BEGIN %s\n(cd /tmp && %s -test.v -test.count=1 -test.timeout %s -test.run %s 2>&1)\necho SBSVM-END %s $?\n",
			r.Name, bin, timeout, shellQuote(re), r.Name)
	}
	script.WriteString("echo SBSVM-DONE\nsync\npoweroff -f\n")
	fs.writeFile("/init2", []byte(script.String()), 0o755)
	return fs.writeTo(dst)
}

// vmInit is the initramfs's /init: runsc cannot pivot_root out of an
// initramfs, so the tree is copied to a tmpfs and entered with switch_root.
const vmInit = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t tmpfs -o size=80% tmpfs /newroot
for f in /*; do
	case "$f" in /proc|/sys|/dev|/newroot) /bin/busybox mkdir -p "/newroot$f" ;; *) /bin/busybox cp -a "$f" /newroot/ ;; esac
done
/bin/busybox umount /proc
exec /bin/busybox switch_root /newroot /init2
`

// vmInit2 is the start of the second stage: mounts, cgroup v2 with its
// controllers delegated to children, loopback up.
const vmInit2 = `/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpuset +cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up
`

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// moduleOrder returns the module files (relative to dir) to load for names,
// each after its dependencies, from dir/modules.dep.
func moduleOrder(dir string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		byName[strings.TrimSuffix(filepath.Base(mod), ".ko")] = mod
	}
	var order []string
	seen := map[string]bool{}
	var add func(m string)
	add = func(m string) {
		if seen[m] {
			return
		}
		seen[m] = true
		ds := deps[m]
		// modules.dep lists every dependency, the ones loaded last first.
		for i := len(ds) - 1; i >= 0; i-- {
			add(ds[i])
		}
		order = append(order, m)
	}
	for _, n := range names {
		m, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("module %q is not in %s/modules.dep", n, dir)
		}
		add(m)
	}
	return order, nil
}

// vmParser follows the guest's serial output.
type vmParser struct {
	mu       sync.Mutex
	results  map[string]*VMResult // "<run>/<test>"
	run      string               // the run in progress
	test     *VMResult            // the top-level test in progress
	last     []string             // the last serial lines
	exits    map[string]string    // a run's exit status, by run
	done     bool                 // SBSVM-DONE seen
	panicked bool
}

func newVMParser(runs []VMRun) *vmParser {
	p := &vmParser{results: map[string]*VMResult{}}
	for _, r := range runs {
		for _, n := range r.Tests {
			p.results[r.Name+"/"+n] = &VMResult{}
		}
	}
	return p
}

var (
	vmRunLine  = regexp.MustCompile(`^=== RUN\s+([^/\s]+)$`)
	vmDoneLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): ([^/\s]+) (\(.*\))$`)
)

const vmTailLines = 40

// consume reads serial lines until EOF; onPanic is called once, when the
// guest's kernel panics.
func (p *vmParser) consume(r io.Reader, onPanic func()) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		p.mu.Lock()
		p.last = append(p.last, line)
		if len(p.last) > vmTailLines {
			p.last = p.last[len(p.last)-vmTailLines:]
		}
		panicked := !p.panicked && strings.Contains(line, "Kernel panic")
		if panicked {
			p.panicked = true
		}
		p.line(line)
		p.mu.Unlock()
		if panicked {
			onPanic()
		}
	}
	if err := sc.Err(); err != nil {
		// A line over the scanner's 1 MiB: say so, and keep draining, or
		// QEMU blocks writing the console and the guest stalls.
		p.mu.Lock()
		p.last = append(p.last, fmt.Sprintf("(testenv: serial output unreadable from here on: %v)", err))
		p.mu.Unlock()
		_, _ = io.Copy(io.Discard, r)
	}
}

func (p *vmParser) line(line string) {
	if f := strings.Fields(line); len(f) >= 2 && f[0] == "SBSVM-BEGIN" {
		p.run, p.test = f[1], nil
		return
	}
	if f := strings.Fields(line); len(f) == 3 && f[0] == "SBSVM-END" {
		if p.exits == nil {
			p.exits = map[string]string{}
		}
		p.exits[f[1]] = f[2]
		p.run, p.test = "", nil
		return
	}
	if line == "SBSVM-DONE" {
		p.done = true
		return
	}
	if p.run == "" {
		return
	}
	if m := vmRunLine.FindStringSubmatch(line); m != nil {
		p.test = p.results[p.run+"/"+m[1]]
		if p.test != nil {
			p.test.Out = append(p.test.Out, line)
		}
		return
	}
	if m := vmDoneLine.FindStringSubmatch(line); m != nil {
		if res := p.results[p.run+"/"+m[2]]; res != nil {
			if res != p.test {
				res.Out = append(res.Out, line)
			}
			res.Status, res.Dur = m[1], m[3]
		}
		if p.test != nil {
			p.test.Out = append(p.test.Out, line)
		}
		p.test = nil
		return
	}
	if p.test != nil && len(p.test.Out) < 2000 {
		p.test.Out = append(p.test.Out, line)
	}
}

func (p *vmParser) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.last, "\n")
}

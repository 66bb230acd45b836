package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOwnTrackerHeldStat: on the real /proc, a checked gofer is held as a
// pidfd (its CPU clock a read); once it exits its stat gives its final
// figure (a zombie's), and once it is reaped it keeps its last figure, the
// descriptor is closed, and a process that reuses nothing is never read
// through it. close releases what is held.
func TestOwnTrackerHeldStat(t *testing.T) {
	const root = "/run/sbs-held-test"
	// A "gofer" of this test: argv[0] runsc-gofer, --root= the root (a loop
	// long enough that the check sees it before the exec of sleep); the
	// "sentry" is this process (not runsc-sandbox: not counted).
	cmd := exec.Command("/bin/sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 100", "x", "--root="+root)
	cmd.Args[0] = "runsc-gofer"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	gofer := cmd.Process.Pid
	// The check reads argv once: wait until the kernel shows the gofer's
	// (a read between fork and exec would see this test's argv for good).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/cmdline")
		if strings.HasPrefix(string(b), "runsc-gofer\x00") || time.Now().After(deadline) {
			break
		}
	}
	o := newOwnTracker("/proc")
	defer o.close()
	self := os.Getpid()
	var first ownRead
	for range 50 { // until the loop has burnt a tick
		r, err := o.read(root, self, []int{gofer})
		if err != nil {
			t.Fatal(err)
		}
		first = r
		if r.Usec > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if first.Counts != 1 || first.Usec == 0 {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/cmdline")
		t.Fatalf("got %+v, want the gofer counted with some CPU (its cmdline now %q)", first, cmdline)
	}
	o.mu.Lock()
	p := o.procs[gofer]
	held := o.held
	o.mu.Unlock()
	if p.fd < 0 || !p.clock || held != 1 {
		t.Fatalf("the gofer is not held by its pidfd: fd %d (clock %v), %d held", p.fd, p.clock, held)
	}
	if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(p.fd)); err != nil || target != "anon_inode:[pidfd]" {
		t.Errorf("the held descriptor is %q (%v), want the gofer's pidfd", target, err)
	}
	cmd.Process.Kill()
	// A zombie (killed, not yet reaped): its clock is not read (the pidfd
	// has exited); its stat, by path, still gives its final figure.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/stat"); strings.Contains(string(b), ") Z ") {
			break
		}
	}
	z, err := o.read(root, self, []int{gofer})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/stat")
	pt, err := parseProcStat(st)
	if err != nil {
		t.Fatal(err)
	}
	if z.Usec < first.Usec || z.Usec < pt.Ticks*(1_000_000/100) || z.Counts != 1 {
		t.Errorf("the zombie: %+v, want it counted with at least its stat's %d ticks and %d us", z, pt.Ticks, first.Usec)
	}
	cmd.Wait() // reaped: what is held of it now answers ESRCH
	r, err := o.read(root, self, []int{gofer})
	if err != nil {
		t.Fatal(err)
	}
	if r.Usec < first.Usec || r.Counts != 0 {
		t.Errorf("after the gofer exited: %+v, want its last figure (>= %d us) and none counted now", r, first.Usec)
	}
	if _, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(p.fd)); err == nil && o.held != 0 {
		t.Errorf("the descriptor is still held (%d held)", o.held)
	}
	o.close()
	if o.held != 0 {
		t.Errorf("%d held after close", o.held)
	}
}

// TestClockTicks: this process's CPU clock, held by its pidfd, agrees with
// its /proc stat (utime + stime, each truncated to a tick: the clock's
// figure, in µs, is at least the stat's before it and at most two ticks
// past the stat's after it); a pidfd's fdinfo names its pid, and only it.
func TestClockTicks(t *testing.T) {
	self, statFD := openSelfStat(t)
	pidfd, ok := holdClock("/proc", self, statFD, 'R', make([]byte, maxStatBytes))
	if !ok {
		t.Fatal("holdClock refused this process")
	}
	defer syscall.Close(pidfd)
	for i := 0; i < 3e7; i++ { // burn a few ticks
		_ = i * i
	}
	ticks := func() uint64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(self) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		pt, err := parseProcStat(b)
		if err != nil {
			t.Fatal(err)
		}
		return pt.Ticks
	}
	before := ticks()
	got, live := clockUsec(self, pidfd)
	after := ticks()
	if !live || got < before*tickUsec || got > (after+2)*tickUsec {
		t.Errorf("clock %d µs (live %v), want between the stat's %d ticks and %d+2", got, live, before, after)
	}
	fdinfo, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		t.Fatal(err)
	}
	if !fdinfoNames(fdinfo, self) || fdinfoNames(fdinfo, self+1) || fdinfoNames([]byte("pos:\t0\n"), self) {
		t.Errorf("fdinfoNames of %q: wrong", fdinfo)
	}
}

// BenchmarkOwnTrackerRead: one read of a sandbox's own processes as the
// breakdown makes it, a "sentry" and four "gofers" (shells with runsc's
// argv[0] and --root=, checked once and held); cpu-ns/op is this process's
// CPU (user + system) a read.
func BenchmarkOwnTrackerRead(b *testing.B) {
	const root = "/run/sbs-own-bench"
	start := func(role string) int {
		cmd := startOwnProc(b, role, root, "while :; do sleep 1; done")
		b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	sentry := start("runsc-sandbox")
	var gofers []int
	for range 4 {
		gofers = append(gofers, start("runsc-gofer"))
	}
	o := newOwnTracker("/proc")
	defer o.close()
	if r, err := o.read(root, sentry, gofers); err != nil || r.Counts != 5 {
		b.Fatalf("first read: %+v, %v: want 5 counted", r, err)
	}
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	for b.Loop() {
		if _, err := o.read(root, sentry, gofers); err != nil {
			b.Fatal(err)
		}
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano() - r0.Utime.Nano() + r1.Stime.Nano() - r0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// TestHoldClockFdinfoCapped: the pidfd's fdinfo is read with a size cap: a
// /proc whose fdinfo names the pid but runs past maxFdinfoBytes is refused
// (the stat is held instead), the same text within the cap is taken.
func TestHoldClockFdinfoCapped(t *testing.T) {
	self, statFD := openSelfStat(t)
	line := "Pid:\t" + strconv.Itoa(self) + "\n"
	for _, tc := range []struct {
		name   string
		fdinfo string
		want   bool
	}{
		{"within the cap", "pos:\t0\n" + line, true},
		{"at the cap", line + strings.Repeat("x", maxFdinfoBytes-len(line)), true},
		{"past the cap", line + strings.Repeat("x", maxFdinfoBytes+1-len(line)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fake /proc/self/fdinfo with this text for every descriptor
			// the pidfd may get.
			proc := t.TempDir()
			dir := filepath.Join(proc, "self", "fdinfo")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for fd := range 1024 {
				if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(fd)), []byte(tc.fdinfo), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			pidfd, ok := holdClock(proc, self, statFD, 'R', make([]byte, maxStatBytes))
			if ok {
				syscall.Close(pidfd)
			}
			if ok != tc.want {
				t.Errorf("holdClock with an fdinfo of %d bytes: %v, want %v", len(tc.fdinfo), ok, tc.want)
			}
		})
	}
}

// startOwnProc starts a shell running script as a sandbox's own process:
// argv[0] role (runsc-sandbox or runsc-gofer), --root=root; it returns once
// the kernel shows that argv (a check between fork and exec would see this
// test's for good). The caller kills and waits.
func startOwnProc(tb testing.TB, role, root, script string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command("/bin/sh", "-c", script, "x", "--root="+root)
	cmd.Args[0] = role
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if c, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline"); strings.HasPrefix(string(c), role+"\x00") {
			break
		}
	}
	return cmd
}

// TestOwnTrackerExitedClock: a held gofer killed while it burns CPU is
// counted, once exited, with its zombie's clock (its final figure to the
// µs), not its stat's ticks (up to 2 ticks below) nor its last live clock
// figure; reaped, that figure is kept.
func TestOwnTrackerExitedClock(t *testing.T) {
	const root = "/run/sbs-exited-test"
	cmd := startOwnProc(t, "runsc-gofer", root, "while :; do :; done")
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	gofer := cmd.Process.Pid
	o := newOwnTracker("/proc")
	defer o.close()
	self := os.Getpid()
	live, err := o.read(root, self, []int{gofer})
	if err != nil || live.Counts != 1 {
		t.Fatalf("first read: %+v, %v: want the gofer counted", live, err)
	}
	if p := o.procs[gofer]; !p.clock {
		t.Fatalf("the gofer is not held by its clock: %+v", p)
	}
	time.Sleep(60 * time.Millisecond) // it burns past its last read
	cmd.Process.Kill()
	var st procTimes
	for deadline := time.Now().Add(5 * time.Second); st.State != 'Z' && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/stat")
		st, _ = parseProcStat(b)
	}
	if st.State != 'Z' {
		t.Fatalf("the gofer is not a zombie: state %c", st.State)
	}
	z, err := o.read(root, self, []int{gofer})
	if err != nil {
		t.Fatal(err)
	}
	// The zombie's clock now, read by this test: its final figure.
	// (Within 200 µs: the CPU of its last switch away, after it was seen
	// a zombie, would come after the tracker's read.)
	final, ok := processClockUsec(gofer)
	if !ok {
		t.Fatal("the zombie's clock does not read")
	}
	if z.Usec > final || final-z.Usec > 200 || z.Usec < st.Ticks*tickUsec {
		t.Errorf("the zombie counted with %d µs, want its final clock %d µs (its stat %d µs, its last live read %d µs)",
			z.Usec, final, st.Ticks*tickUsec, live.Usec)
	}
	t.Logf("final %d µs: the stat's %d µs, the last live read's %d µs", final, st.Ticks*tickUsec, live.Usec)
	cmd.Wait()
	if r, err := o.read(root, self, []int{gofer}); err != nil || r.Usec != z.Usec || r.Counts != 0 {
		t.Errorf("reaped: %+v, %v: want its final %d µs kept, none counted", r, err, z.Usec)
	}
}

// openSelfStat returns this process's pid and its /proc stat, open until
// the test ends.
func openSelfStat(t *testing.T) (int, int) {
	t.Helper()
	self := os.Getpid()
	statFD, _, err := openStat("/proc/"+strconv.Itoa(self)+"/stat", make([]byte, maxStatBytes))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(statFD) })
	return self, statFD
}

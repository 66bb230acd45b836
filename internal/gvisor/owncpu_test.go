package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// fakeProc is a /proc of the sandbox's processes for the own-share tests.
type fakeProc struct {
	t   testing.TB
	dir string
}

func newFakeProc(t testing.TB) *fakeProc { return &fakeProc{t: t, dir: t.TempDir()} }

// set writes pid's stat (ticks of CPU split between utime and stime,
// started at start), cmdline and cgroup.
func (f *fakeProc) set(pid int, state byte, ticks, start uint64, args []string, cgroup string) {
	f.t.Helper()
	d := filepath.Join(f.dir, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		f.t.Fatal(err)
	}
	comm := "exe"
	if len(args) > 0 {
		comm = filepath.Base(args[0])
	}
	stat := fmt.Sprintf("%d (%s) %c 1 1 1 0 -1 4194560 10 0 0 0 %d %d 0 0 20 0 4 0 %d 1000 100\n", pid, comm, state, ticks/2, ticks-ticks/2, start)
	for name, b := range map[string]string{"stat": stat, "cmdline": strings.Join(args, "\x00") + "\x00", "cgroup": cgroup} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(b), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

// setTicks changes only pid's CPU.
func (f *fakeProc) setTicks(pid int, ticks, start uint64) {
	f.t.Helper()
	stat := fmt.Sprintf("%d (x) S 1 1 1 0 -1 4194560 10 0 0 0 %d %d 0 0 20 0 4 0 %d 1000 100\n", pid, ticks/2, ticks-ticks/2, start)
	if err := os.WriteFile(filepath.Join(f.dir, strconv.Itoa(pid), "stat"), []byte(stat), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeProc) exit(pid int) { os.RemoveAll(filepath.Join(f.dir, strconv.Itoa(pid))) }

// TestParseProcStat: the own-CPU read's view of a stat line
// (process.ParseStatFields, its cases there): utime+stime, and errors that
// wrap both sentinels.
func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    procTimes
		wantErr bool
	}{
		{"runsc-sandbox", "21385 (runsc-sandbox) S 1 21385 21385 0 -1 4194560 3064 0 0 0 5 3 0 0 20 0 12 0 1234567 1000 100", procTimes{'S', 8, 1234567}, false},
		{"a name with ') ' and spaces", "7 (a) b) c) Z 1 1 1 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 99 0 0", procTimes{'Z', 30, 99}, false},
		{"cut after the name", "7 (a)", procTimes{}, true},
		{"utime not a number", "7 (a) S 1 1 1 0 -1 0 0 0 0 0 x 20 0 0 20 0 1 0 99 0 0", procTimes{}, true},
		{"utime+stime overflow", "7 (a) S 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 1 0 0 20 0 1 0 99 0 0", procTimes{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat([]byte(tc.in))
			if (err != nil) != tc.wantErr || err != nil && !errors.Is(err, ErrProcStat) {
				t.Fatalf("err %v, want error %v (ErrProcStat)", err, tc.wantErr)
			}
			if err != nil && tc.name != "utime+stime overflow" && !errors.Is(err, process.ErrMalformedStat) {
				t.Errorf("err %v, want process.ErrMalformedStat too", err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPlatformOf(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"runsc-sandbox", "--root=/r", "--platform=kvm", "boot"}, "kvm"},
		{[]string{"runsc-sandbox", "-platform", "ptrace"}, "ptrace"},
		{[]string{"runsc-sandbox", "--platform"}, ""},
		{[]string{"runsc-sandbox", "boot"}, ""},
	} {
		if got := platformOf(tc.args); got != tc.want {
			t.Errorf("platformOf(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// The sandbox of the own-share tests: sentry 10 and gofers 11, 12 started
// with --root=root, all in the cgroup sbxCgroup.
const sbxCgroup = "0::/sandbox\n"

func sentryArgs(root string, extra ...string) []string {
	return append([]string{"runsc-sandbox", "--root=" + root, "--network=none"}, append(extra, "boot")...)
}

func goferArgs(root string) []string { return []string{"runsc-gofer", "--root=" + root, "gofer"} }

func TestOwnTracker(t *testing.T) {
	const root = "/run/runsc"
	setup := func(t *testing.T) (*fakeProc, *ownTracker) {
		p := newFakeProc(t)
		p.set(10, 'S', 8, 1000, sentryArgs(root), sbxCgroup)
		p.set(11, 'S', 3, 1001, goferArgs(root), sbxCgroup)
		p.set(12, 'S', 2, 1002, goferArgs(root), sbxCgroup)
		o := newOwnTracker(p.dir)
		o.closed = true // a fake /proc's files outlive their "process": no held descriptors (TestOwnTrackerHeldStat)
		return p, o
	}
	read := func(t *testing.T, o *ownTracker, gofers ...int) ownRead {
		t.Helper()
		r, err := o.read(root, 10, gofers)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	t.Run("sentry and gofers, each checked once", func(t *testing.T) {
		p, o := setup(t)
		if got, want := read(t, o, 11, 12), (ownRead{Usec: 130_000, Counts: 3}); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
		// The check is paid once per (pid, start time): a command line
		// that no longer says runsc-gofer is not read again.
		os.WriteFile(filepath.Join(p.dir, "11", "cmdline"), []byte("sleep\x00"), 0o644)
		p.setTicks(11, 5, 1001)
		if got, want := read(t, o, 11, 12), (ownRead{Usec: 150_000, Counts: 3}); got != want {
			t.Errorf("after the gofer's CPU grew: got %+v, want %+v", got, want)
		}
	})
	t.Run("processes that are not the sandbox's do not count", func(t *testing.T) {
		p, o := setup(t)
		p.set(13, 'S', 50, 1003, []string{"sleep", "1"}, sbxCgroup)                         // not a gofer
		p.set(14, 'S', 50, 1004, goferArgs("/other"), "0::/elsewhere\n")                    // another root's gofer
		p.set(15, 'S', 1, 1005, []string{"runsc-gofer", "--root=/run/./runsc/"}, sbxCgroup) // this root, spelt otherwise
		p.set(16, 'S', 1, 1006, goferArgs("/else"), sbxCgroup)                              // another root, the sentry's cgroup
		if got, want := read(t, o, 11, 12, 13, 14, 15, 16), (ownRead{Usec: 150_000, Counts: 5}); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("a gofer that exits keeps its figure", func(t *testing.T) {
		p, o := setup(t)
		read(t, o, 11, 12)
		p.setTicks(12, 4, 1002)
		read(t, o, 11, 12)
		p.exit(12)
		if got, want := read(t, o, 11), (ownRead{Usec: 150_000, Counts: 2}); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
		if got, want := read(t, o, 11), (ownRead{Usec: 150_000, Counts: 2}); got != want {
			t.Errorf("again: got %+v, want %+v", got, want)
		}
	})
	t.Run("a reused pid is a new process", func(t *testing.T) {
		p, o := setup(t)
		read(t, o, 11, 12)
		p.set(12, 'S', 100, 2000, []string{"sh"}, sbxCgroup) // gofer 12 gone, its pid reused
		if got, want := read(t, o, 11, 12), (ownRead{Usec: 130_000, Counts: 2}); got != want {
			t.Errorf("pid reused by another program: got %+v, want %+v", got, want)
		}
		p.set(12, 'S', 1, 3000, goferArgs(root), sbxCgroup) // and again, by a gofer of this sandbox
		if got, want := read(t, o, 11, 12), (ownRead{Usec: 140_000, Counts: 3}); got != want {
			t.Errorf("pid reused by a gofer: got %+v, want %+v", got, want)
		}
	})
	t.Run("kvm platform", func(t *testing.T) {
		p, o := setup(t)
		p.set(10, 'S', 8, 1000, sentryArgs(root, "--platform=kvm"), sbxCgroup)
		if got := read(t, o, 11, 12); !got.KVM {
			t.Errorf("got %+v, want KVM", got)
		}
	})
	t.Run("an unreadable stat keeps the last figure and says why", func(t *testing.T) {
		p, o := setup(t)
		read(t, o, 11, 12)
		os.WriteFile(filepath.Join(p.dir, "12", "stat"), []byte("garbage"), 0o644)
		got, err := o.read(root, 10, []int{11, 12})
		if !errors.Is(err, ErrProcStat) || got != (ownRead{Usec: 130_000, Counts: 3}) {
			t.Errorf("got %+v, %v; want the last figures and ErrProcStat", got, err)
		}
	})
}

// TestSampleOwnShare: a Sample with the sandbox's processes in /proc: the
// own share is their CPU plus the pause container's part of the rest; under
// the kvm platform it is absent and the whole cgroup is split.
func TestSampleOwnShare(t *testing.T) {
	reply := []byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"gvx-sbx","data":{}},"containerUsage":{"gvx-busy":3000000000,"gvx-sbx":1000000000}}}`)
	// The fixtures' sentry 21385, gofers 21384 (the sandbox's) and 21436
	// (busy's): 5 + 2 + 1 ticks, 80 ms.
	for _, tc := range []struct {
		name     string
		platform []string
		wantBusy uint64
		wantOwn  *uint64
	}{
		{"ptrace", nil, (v2SandboxCPU - 80_000) * 3 / 4, u64(80_000 + (v2SandboxCPU-80_000)/4)},
		{"kvm", []string{"--platform=kvm"}, v2SandboxCPU * 3 / 4, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := getRunscRoot(t, boundToV2)
			fakeSentry(t, root, "gvx-sbx", reply)
			p := newFakeProc(t)
			p.set(21385, 'S', 5, 1000, sentryArgs(root, tc.platform...), sbxCgroup)
			p.set(21384, 'S', 2, 999, goferArgs(root), sbxCgroup)
			p.set(21436, 'S', 1, 1100, goferArgs(root), sbxCgroup)
			r, err := openWithProc(t, root, p.dir, 0).Sample(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Containers) != 1 || r.Containers[0].CPUUsageUsec == nil || *r.Containers[0].CPUUsageUsec != tc.wantBusy {
				t.Errorf("containers %+v, want busy %d", r.Containers, tc.wantBusy)
			}
			if diff := cmp.Diff(tc.wantOwn, r.SandboxOwnCPUUsec); diff != "" {
				t.Errorf("sandbox_own_cpu_usec (-want +got)\n%s", diff)
			}
			if tc.wantOwn == nil && !hasAbsent(r.Absent, "sandbox_own_cpu_usec", "kvm") {
				t.Errorf("absent %v, want sandbox_own_cpu_usec's reason", r.Absent)
			}
		})
	}
}

// TestParseProcStatAllocs: the own-CPU read parses every own process's stat
// at every sample without allocating.
func TestParseProcStatAllocs(t *testing.T) {
	b := []byte("21385 (runsc-sandbox) S 1 21385 21385 0 -1 4194560 3064 0 0 0 5 3 0 0 20 0 12 0 1234567 1000 100\n")
	if n := testing.AllocsPerRun(100, func() {
		if _, err := parseProcStat(b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a parse, want 0", n)
	}
}

// TestFdinfoNames: a pidfd's fdinfo names its pid on its first "Pid:" line
// only (NSpid is another line; a pid namespace that cannot see the process
// shows -1).
func TestFdinfoNames(t *testing.T) {
	const real = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t5694\nNSpid:\t5694\n"
	for _, tc := range []struct {
		name, fdinfo string
		pid          int
		want         bool
	}{
		{"this kernel's", real, 5694, true},
		{"another pid", real, 5695, false},
		{"a prefix of it", real, 569, false},
		{"no trailing newline", "pos:\t0\nPid:\t42", 42, true},
		{"spaces", "Pid:   42  \n", 42, true},
		{"not a pidfd's", "pos:\t0\nflags:\t0100000\nmnt_id:\t24\nino:\t3\n", 42, false},
		{"another namespace", "Pid:\t-1\nNSpid:\t-1\n", 42, false},
		{"NSpid only", "NSpid:\t42\n", 42, false},
		{"the first Pid line counts", "Pid:\t7\nPid:\t42\n", 42, false},
		{"more after the number", "Pid:\t42 43\n", 42, false},
		{"a sign", "Pid:\t+42\n", 42, false},
		{"leading zero", "Pid:\t042\n", 42, false},
		{"indented", " Pid:\t42\n", 42, false},
		{"empty", "", 42, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fdinfoNames([]byte(tc.fdinfo), tc.pid); got != tc.want {
				t.Errorf("fdinfoNames(%q, %d) = %v, want %v", tc.fdinfo, tc.pid, got, tc.want)
			}
		})
	}
}

// FuzzFdinfoNames: any text: no panic; a match means the first "Pid:" line
// is the pid's decimal (spaces around); the pid's line put first always
// matches. `go test -fuzz FuzzFdinfoNames ./internal/gvisor`.
func FuzzFdinfoNames(f *testing.F) {
	f.Add([]byte("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t5694\nNSpid:\t5694\n"), 5694)
	f.Add([]byte("Pid:\t-1\n"), -1)
	f.Add([]byte("Pid:\t\n"), 0)
	f.Fuzz(func(t *testing.T, b []byte, pid int) {
		if fdinfoNames(b, pid) {
			first := ""
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "Pid:"); ok {
					first = v
					break
				}
			}
			if n, err := strconv.Atoi(strings.TrimSpace(first)); err != nil || n != pid {
				t.Errorf("fdinfoNames(%q, %d): true, but its first Pid line holds %q", b, pid, first)
			}
		}
		if !fdinfoNames(append([]byte("Pid:\t"+strconv.Itoa(pid)+"\n"), b...), pid) {
			t.Errorf("fdinfoNames: the line of %d put first does not name it", pid)
		}
	})
}

package process

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// statLine is a kernel's /proc/<pid>/stat line of a QEMU vCPU thread (52
// fields): utime 5, stime 7, starttime 86000, guest_time 9.
const statLine = "4242 (CPU 0/KVM) S 1 4242 4242 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 86000 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n"

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want Stat
		err  bool
	}{
		{"vCPU thread", statLine, Stat{Comm: "CPU 0/KVM", State: "S", PPID: 1, UTime: 5, STime: 7, Starttime: 86000, GuestTime: 9}, false},
		{"name with parentheses and spaces", strings.Replace(statLine, "(CPU 0/KVM)", "(a) (b) S 9 9)", 1),
			Stat{Comm: "a) (b) S 9 9", State: "S", PPID: 1, UTime: 5, STime: 7, Starttime: 86000, GuestTime: 9}, false},
		{"zombie", strings.Replace(statLine, ") S ", ") Z ", 1), Stat{Comm: "CPU 0/KVM", State: "Z", PPID: 1, UTime: 5, STime: 7, Starttime: 86000, GuestTime: 9}, false},
		{"stops before starttime", "9 (x) S 1 9 9 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0", Stat{}, true},
		{"ends at the name", "9 (x)", Stat{}, true},
		{"no name", "9 x S 1", Stat{}, true},
		{"empty", "", Stat{}, true},
		{"negative utime", strings.Replace(statLine, " 5 7 ", " -5 7 ", 1), Stat{}, true},
		{"ppid past pid_t", strings.Replace(statLine, ") S 1 ", ") S 4294967296 ", 1), Stat{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tc.line))
			if tc.err {
				if !errors.Is(err, ErrMalformedStat) {
					t.Fatalf("err = %v, want ErrMalformedStat", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseStatWithoutGuestTime: a line that stops after starttime (field
// 22) parses, guest_time 0.
func TestParseStatWithoutGuestTime(t *testing.T) {
	f := strings.Fields(strings.Replace(statLine, "(CPU 0/KVM)", "(qemu)", 1))
	got, err := ParseStat([]byte(strings.Join(f[:22], " ")))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stat{Comm: "qemu", State: "S", PPID: 1, UTime: 5, STime: 7, Starttime: 86000}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func FuzzParseStat(f *testing.F) {
	for _, s := range []string{statLine, "9 (x)", "9 (a) (b) S", "", "9 (x) S 1", strings.Replace(statLine, ") S ", ") Z ", 1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseStat(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedStat) {
				t.Fatalf("err %v is not ErrMalformedStat", err)
			}
			return
		}
		if !strings.Contains(string(b), "("+st.Comm+")") || st.PPID < 0 {
			t.Fatalf("%+v from %q", st, b)
		}
	})
}

func TestParseCPUStat(t *testing.T) {
	for _, tc := range []struct {
		name   string
		text   string
		total  CPUStat
		perCPU map[int64]CPUStat
		err    bool
	}{
		{"kernel", "cpu  10 1 20 300 4 5 6 7 8 9\ncpu0 5 1 10 150 2 3 3 4 4 5\ncpu1 5 0 10 150 2 2 3 3 4 4\nintr 1 2 3\nctxt 99\nbtime 1700000000\n",
			CPUStat{10, 1, 20, 300, 4, 5, 6, 7, 8, 9},
			map[int64]CPUStat{0: {5, 1, 10, 150, 2, 3, 3, 4, 4, 5}, 1: {5, 0, 10, 150, 2, 2, 3, 3, 4, 4}}, false},
		{"older kernel: fewer columns", "cpu  1 2 3 4\ncpu0 1 2 3 4\n", CPUStat{User: 1, Nice: 2, System: 3, Idle: 4}, map[int64]CPUStat{0: {User: 1, Nice: 2, System: 3, Idle: 4}}, false},
		{"more columns than known", "cpu  1 2 3 4 5 6 7 8 9 10 11\n", CPUStat{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, map[int64]CPUStat{}, false},
		{"no cpu line", "intr 1\n", CPUStat{}, map[int64]CPUStat{}, false},
		{"negative", "cpu  -1 x\n", CPUStat{}, nil, true},
		{"no figures", "cpu\n", CPUStat{}, nil, true},
		{"not a CPU number", "cpux 1 2\n", CPUStat{}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total, perCPU, err := ParseCPUStat([]byte(tc.text))
			if tc.err {
				if !errors.Is(err, ErrMalformedStat) {
					t.Fatalf("err = %v, want ErrMalformedStat", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.total, total); diff != "" {
				t.Errorf("total (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.perCPU, perCPU); diff != "" {
				t.Errorf("per CPU (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseCPUStat(f *testing.F) {
	f.Add([]byte("cpu  10 1 20 300 4 5 6 7 8 9\ncpu0 5 1 10 150 2 3 3 4 4 5\n"))
	f.Add([]byte("cpu  -1 x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := ParseCPUStat(b); err != nil && !errors.Is(err, ErrMalformedStat) {
			t.Fatalf("err %v is not ErrMalformedStat", err)
		}
	})
}

// TestProcessFiles reads a thread's files in a tree shaped like /proc:
// stat, comm, schedstat, the process's cmdline and the pids of task/.
func TestProcessFiles(t *testing.T) {
	root := t.TempDir()
	task := filepath.Join(root, "4242", "task")
	for path, content := range map[string]string{
		"4242/cmdline":             "qemu-system-x86_64\x00-name\x00guest=vm1\x00",
		"4242/task/4242/stat":      statLine,
		"4242/task/4243/stat":      statLine,
		"4242/task/4243/comm":      "CPU 0/KVM\n",
		"4242/task/4243/schedstat": "1000 200 3\n",
		"4242/task/4244/schedstat": "1000 x 3\n",
		"4242/task/4245/schedstat": "1000 200\n",
		"4242/task/self/stat":      statLine,
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pids, err := PIDs(task)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pids)
	if diff := cmp.Diff([]int{4242, 4243, 4244, 4245}, pids); diff != "" {
		t.Errorf("PIDs (-want +got):\n%s", diff)
	}
	if args, err := ReadCmdline(filepath.Join(root, "4242")); err != nil || !slices.Equal(args, []string{"qemu-system-x86_64", "-name", "guest=vm1"}) {
		t.Errorf("cmdline %q, %v", args, err)
	}
	if c, err := ReadComm(filepath.Join(task, "4243")); err != nil || c != "CPU 0/KVM" {
		t.Errorf("comm %q, %v", c, err)
	}
	if ss, err := ReadSchedstat(filepath.Join(task, "4243")); err != nil || ss != (Schedstat{1000, 200, 3}) {
		t.Errorf("schedstat %+v, %v", ss, err)
	}
	for _, tid := range []string{"4244", "4245"} {
		if _, err := ReadSchedstat(filepath.Join(task, tid)); !errors.Is(err, ErrMalformedStat) {
			t.Errorf("schedstat of %s: err = %v, want ErrMalformedStat", tid, err)
		}
	}
	if st, err := ReadStat(filepath.Join(task, "4243")); err != nil || st.Starttime != 86000 {
		t.Errorf("stat %+v, %v", st, err)
	}
	if _, err := ReadStat(filepath.Join(task, "4246")); !IsGone(err) {
		t.Errorf("a thread gone: err = %v, want gone", err)
	}
	if _, err := PIDs(filepath.Join(root, "4246", "task")); !IsGone(err) {
		t.Errorf("a process gone: err = %v, want gone", err)
	}
}

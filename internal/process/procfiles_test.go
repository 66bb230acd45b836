package process

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

// statLine is a kernel's /proc/<pid>/stat line of a QEMU vCPU thread (52
// fields): utime 5, stime 7, starttime 86000, vsize 1, rss 1, guest_time 9.
const statLine = "4242 (CPU 0/KVM) S 1 4242 4242 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 86000 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n"

// lineStat is a Stat of statLine's figures, of command name comm in state.
func lineStat(comm string, state byte) Stat {
	return Stat{Comm: comm, StatFields: StatFields{State: state, PPID: 1, UTime: 5, STime: 7, Starttime: 86000, VSize: 1, RSS: 1, GuestTime: 9}}
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want Stat
		err  bool
	}{
		{"vCPU thread", statLine, lineStat("CPU 0/KVM", 'S'), false},
		{"name with parentheses and spaces", strings.Replace(statLine, "(CPU 0/KVM)", "(a) (b) S 9 9)", 1), lineStat("a) (b) S 9 9", 'S'), false},
		{"name with ') ' before the state", strings.Replace(statLine, "(CPU 0/KVM) S", "(a) b) c) Z", 1), lineStat("a) b) c", 'Z'), false},
		{"zombie", strings.Replace(statLine, ") S ", ") Z ", 1), lineStat("CPU 0/KVM", 'Z'), false},
		{"runsc-sandbox, cut after field 24", "21385 (runsc-sandbox) S 1 21385 21385 0 -1 4194560 3064 0 0 0 5 3 0 0 20 0 12 0 1234567 1000 100",
			Stat{Comm: "runsc-sandbox", StatFields: StatFields{State: 'S', PPID: 1, UTime: 5, STime: 3, Starttime: 1234567, VSize: 1000, RSS: 100}}, false},
		{"cut after field 23", "7 (x) S 1 7 7 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 99 4096",
			Stat{Comm: "x", StatFields: StatFields{State: 'S', PPID: 1, UTime: 5, STime: 3, Starttime: 99, VSize: 4096}}, false},
		{"utime of 2^64-1", strings.Replace(statLine, " 5 7 ", " 18446744073709551615 7 ", 1),
			Stat{Comm: "CPU 0/KVM", StatFields: StatFields{State: 'S', PPID: 1, UTime: 1<<64 - 1, STime: 7, Starttime: 86000, VSize: 1, RSS: 1, GuestTime: 9}}, false},
		{"stops before starttime", "9 (x) S 1 9 9 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0", Stat{}, true},
		{"ends at the name", "9 (x)", Stat{}, true},
		{"no name", "9 x S 1", Stat{}, true},
		{"no '(' before the last ')'", strings.Replace(statLine, "(CPU", "CPU", 1), Stat{}, true},
		{"empty", "", Stat{}, true},
		{"state not a letter", strings.Replace(statLine, ") S ", ") 1 ", 1), Stat{}, true},
		{"state of two letters", strings.Replace(statLine, ") S ", ") SZ ", 1), Stat{}, true},
		{"utime not a number", strings.Replace(statLine, " 5 7 ", " x 7 ", 1), Stat{}, true},
		{"negative utime", strings.Replace(statLine, " 5 7 ", " -5 7 ", 1), Stat{}, true},
		{"utime past 2^64-1", strings.Replace(statLine, " 5 7 ", " 18446744073709551616 7 ", 1), Stat{}, true},
		{"guest_time not a number", strings.Replace(statLine, " 9 0 0 ", " x 0 0 ", 1), Stat{}, true},
		{"vsize not a number", strings.Replace(statLine, " 86000 1 1 ", " 86000 -1 1 ", 1), Stat{}, true},
		{"rss not a number", strings.Replace(statLine, " 86000 1 1 ", " 86000 1 x ", 1), Stat{}, true},
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
	if want := (Stat{Comm: "qemu", StatFields: StatFields{State: 'S', PPID: 1, UTime: 5, STime: 7, Starttime: 86000}}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestParseStatFieldsAllocs: gvisor's own-CPU read runs ParseStatFields for
// every own process at every sample: it must not allocate.
func TestParseStatFieldsAllocs(t *testing.T) {
	b := []byte(statLine)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ParseStatFields(b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a parse, want 0", n)
	}
}

// FuzzParseStat checks ParseStat against refParseStat (bytes.Fields and
// strconv) and that the command name it gives stands between '(' and ')'
// in the line.
func FuzzParseStat(f *testing.F) {
	for _, s := range []string{
		statLine, "9 (x)", "9 (a) (b) S", "", "9 (x) S 1", "7 ()", strings.Replace(statLine, ") S ", ") Z ", 1),
		"21385 (runsc-sandbox) S 1 21385 21385 0 -1 4194560 3064 0 0 0 5 3 0 0 20 0 12 0 1234567 1000 100\n",
		"7 (a) b) c) Z 1 1 1 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 99 0 0",
		"7 (a) S 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 1 0 0 20 0 1 0 99 0 0",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseStat(b)
		if want, ok := refParseStat(b); !hasUnicodeSpace(b) && (ok != (err == nil) || ok && st != want) {
			t.Fatalf("ParseStat(%q) = %+v, %v; strconv's reading %+v, %v", b, st, err, want, ok)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformedStat) {
				t.Fatalf("err %v is not ErrMalformedStat", err)
			}
			return
		}
		if !strings.Contains(string(b), "("+st.Comm+")") || st.PPID < 0 || st.State == 0 {
			t.Fatalf("%+v from %q", st, b)
		}
	})
}

// refParseStat is the parse with bytes.Fields and strconv (the parsers
// before ParseStatFields), for FuzzParseStat to compare.
func refParseStat(b []byte) (Stat, bool) {
	l, r := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if l < 0 || r < l {
		return Stat{}, false
	}
	f := bytes.Fields(b[r+1:])
	if len(f) < 20 || len(f[0]) != 1 || !unicode.IsLetter(rune(f[0][0])) || f[0][0] > 0x7f {
		return Stat{}, false
	}
	var v [7]uint64 // fields 4, 14, 15, 22, 23, 24, 43; 0 past the line's end
	for k, n := range []int{4, 14, 15, 22, 23, 24, 43} {
		if n-3 >= len(f) {
			continue
		}
		x, err := strconv.ParseUint(string(f[n-3]), 10, 64)
		if err != nil {
			return Stat{}, false
		}
		v[k] = x
	}
	if v[0] > math.MaxInt32 {
		return Stat{}, false
	}
	return Stat{Comm: string(b[l+1 : r]), StatFields: StatFields{State: f[0][0], PPID: int(v[0]), UTime: v[1], STime: v[2], Starttime: v[3],
		VSize: v[4], RSS: v[5], GuestTime: v[6]}}, true
}

// hasUnicodeSpace reports white space bytes.Fields splits at that
// ParseStatFields does not (non-ASCII: U+0085, U+00A0, ...).
func hasUnicodeSpace(b []byte) bool {
	for _, r := range string(b) {
		if r > 0x7f && unicode.IsSpace(r) {
			return true
		}
	}
	return false
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

func TestParseBootTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		want uint64
		err  bool
	}{
		{"a kernel's /proc/stat", "cpu  10 1 20 300 4 5 6 7 8 9\ncpu0 5 1 10 150 2 3 3 4 4 5\nintr 1 0\nctxt 99\nbtime 1765000000\nprocesses 7\n", 1765000000, false},
		{"last line without a newline", "ctxt 99\nbtime 42", 42, false},
		{"no btime", "cpu  10 1 20 300\nctxt 99\n", 0, true},
		{"btime not a number", "btime -1\n", 0, true},
		{"btime past 2^64-1", "btime 18446744073709551616\n", 0, true},
		{"btime without its figure", "btime\n", 0, true},
		{"btime with two figures", "btime 1 2\n", 0, true},
		{"a longer name is not btime", "btimes 7\nbtime 8\n", 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBootTime([]byte(tc.text))
			if tc.err {
				if !errors.Is(err, ErrMalformedStat) {
					t.Fatalf("got %d, %v; want ErrMalformedStat", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// FuzzParseBootTime checks ParseBootTime against strconv's reading of the
// first btime line.
func FuzzParseBootTime(f *testing.F) {
	f.Add([]byte("cpu  10 1 20 300 4 5 6 7 8 9\nbtime 1765000000\nprocesses 7\n"))
	f.Add([]byte("btime x\n"))
	f.Add([]byte("btime 1 2\nbtime 3\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseBootTime(b)
		if err != nil && !errors.Is(err, ErrMalformedStat) {
			t.Fatalf("err %v is not ErrMalformedStat", err)
		}
		if hasUnicodeSpace(b) {
			return
		}
		for line := range bytes.Lines(b) {
			f := bytes.Fields(line)
			if len(f) == 0 || string(f[0]) != "btime" {
				continue
			}
			want, perr := strconv.ParseUint(string(f[len(f)-1]), 10, 64)
			if ok := len(f) == 2 && perr == nil; ok != (err == nil) || ok && got != want {
				t.Fatalf("ParseBootTime(%q) = %d, %v; strconv's reading %d, %v", b, got, err, want, perr)
			}
			return
		}
		if err == nil {
			t.Fatalf("ParseBootTime(%q) = %d without a btime line", b, got)
		}
	})
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

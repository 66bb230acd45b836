package gvisor

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// checkErr fails unless err contains want ("" wants no error).
func checkErr(t *testing.T, err error, want string) bool {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %v, want none", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	return want != ""
}

func TestParseLimits(t *testing.T) {
	const page4k = 4096
	for _, tc := range []struct {
		name    string
		parse   func([]byte) (source.Limit, error)
		in      string
		want    source.Limit
		wantErr string
	}{
		{name: "memory.max number", parse: parseLimit, in: "67108864\n", want: source.Limit{Value: 67108864}},
		{name: "memory.max max", parse: parseLimit, in: "max\n", want: source.Limit{Unlimited: true}},
		{name: "pids.max 0", parse: parseLimit, in: "0\n", want: source.Limit{Value: 0}},
		{name: "memory.max negative", parse: parseLimit, in: "-1\n", wantErr: `token "-1"`},
		{name: "memory.max Max is not max", parse: parseLimit, in: "Max\n", wantErr: `token "Max"`},
		{name: "memory.max two tokens", parse: parseLimit, in: "max 1\n", wantErr: "want one value"},
		{name: "memory.max empty", parse: parseLimit, in: "\n", wantErr: "empty file"},
		{name: "v1 limit 64 MiB", parse: func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, page4k) },
			in: "67108864\n", want: source.Limit{Value: 67108864}},
		{name: "v1 limit page-rounded PAGE_COUNTER_MAX", parse: func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, page4k) },
			in: "9223372036854771712\n", want: source.Limit{Unlimited: true}},
		{name: "v1 limit just below", parse: func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, page4k) },
			in: "9223372036854767616\n", want: source.Limit{Value: 9223372036854767616}},
		{name: "v1 limit 64 KiB pages", parse: func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, 65536) },
			in: "9223372036854710272\n", want: source.Limit{Unlimited: true}},
		{name: "v1 limit max is malformed", parse: func(b []byte) (source.Limit, error) { return parseV1MemLimit(b, page4k) },
			in: "max\n", wantErr: `token "max"`},
		{name: "cfs quota -1", parse: parseCFSQuota, in: "-1\n", want: source.Limit{Unlimited: true}},
		{name: "cfs quota 20 ms", parse: parseCFSQuota, in: "20000\n", want: source.Limit{Value: 20000}},
		{name: "cfs quota -2", parse: parseCFSQuota, in: "-2\n", wantErr: `token "-2"`},
		{name: "cfs quota max is malformed", parse: parseCFSQuota, in: "max\n", wantErr: `token "max"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseCPUMax(t *testing.T) {
	for _, tc := range []struct {
		in         string
		wantQuota  source.Limit
		wantPeriod uint64
		wantErr    string
	}{
		{in: "max 100000\n", wantQuota: source.Limit{Unlimited: true}, wantPeriod: 100000},
		{in: "20000 100000\n", wantQuota: source.Limit{Value: 20000}, wantPeriod: 100000},
		{in: "20000\n", wantErr: "got 1 fields"},
		{in: "-1 100000\n", wantErr: `quota: token "-1"`},
		{in: "max max\n", wantErr: `period token "max"`},
	} {
		t.Run(strconv.Quote(tc.in), func(t *testing.T) {
			q, p, err := parseCPUMax([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if q != tc.wantQuota || p != tc.wantPeriod {
				t.Fatalf("got %+v %d, want %+v %d", q, p, tc.wantQuota, tc.wantPeriod)
			}
		})
	}
}

func TestParseKeyedMap(t *testing.T) {
	got, err := parseKeyedMap([]byte("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\noom 7\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("memory.events (-want +got):\n%s", diff)
	}
	if _, err := parseKeyedMap([]byte("oom_kill_disable 0\nunder_oom x\n")); err == nil || !strings.Contains(err.Error(), `line 2 "under_oom x": token "x"`) {
		t.Errorf("malformed oom_control: %v", err)
	}
}

func TestParsePressure(t *testing.T) {
	const (
		both    = "some avg10=6.55 avg60=10.03 avg300=18.25 total=375944898\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=12\n"
		oldCPU  = "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"
		extraKV = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1 future=x\n"
	)
	for _, tc := range []struct {
		name    string
		in      string
		want    pressureTotals
		wantErr string
	}{
		{name: "some and full", in: both, want: pressureTotals{Some: u64(375944898), Full: u64(12)}},
		{name: "cpu before Linux 5.13: no full", in: oldCPU, want: pressureTotals{Some: u64(42)}},
		{name: "unknown key tolerated", in: extraKV, want: pressureTotals{Some: u64(1)}},
		{name: "no some", in: "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n", wantErr: `no "some" line`},
		{name: "two some", in: oldCPU + oldCPU, wantErr: `a second "some" line`},
		{name: "bad kind", in: "most avg10=0.00 total=1\n", wantErr: `token "most"`},
		{name: "bad total", in: "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n", wantErr: `token "total=-1"`},
		{name: "no total", in: "some avg10=0.00 avg60=0.00 avg300=0.00\n", wantErr: "no total="},
		{name: "bad average", in: "some avg10=x avg60=0.00 avg300=0.00 total=1\n", wantErr: `token "avg10=x"`},
		{name: "negative average", in: "some avg10=-1.00 avg60=0.00 avg300=0.00 total=1\n", wantErr: `token "avg10=-1.00"`},
		{name: "bare token", in: "some total=1 oops\n", wantErr: `token "oops"`},
		{name: "empty", in: "", wantErr: `no "some" line`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePressure([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"max\n", "67108864\n", "-1", "", "max 1", "Max"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLimit([]byte(s))
		if err != nil {
			return
		}
		if l.Unlimited && l.Value != 0 {
			t.Fatalf("unlimited with value %d", l.Value)
		}
		// Round trip through the kernel's spelling.
		out := strconv.FormatUint(l.Value, 10)
		if l.Unlimited {
			out = "max"
		}
		if back, err := parseLimit([]byte(out + "\n")); err != nil || back != l {
			t.Fatalf("round trip of %+v: %+v, %v", l, back, err)
		}
	})
}

func FuzzParseV1MemLimit(f *testing.F) {
	for _, s := range []string{"9223372036854771712\n", "67108864\n", "max", "-1", ""} {
		f.Add(s, uint64(4096))
	}
	f.Add("9223372036854710272\n", uint64(65536))
	f.Fuzz(func(t *testing.T, s string, page uint64) {
		l, err := parseV1MemLimit([]byte(s), page)
		if err != nil {
			return
		}
		if !l.Unlimited && l.Value >= v1Unlimited(page) {
			t.Fatalf("limited value %d at or above the no-limit value %d", l.Value, v1Unlimited(page))
		}
	})
}

func FuzzParseCFSQuota(f *testing.F) {
	for _, s := range []string{"-1\n", "20000\n", "-2", "max", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseCFSQuota([]byte(s))
		if err == nil && l.Unlimited && l.Value != 0 {
			t.Fatalf("unlimited with value %d", l.Value)
		}
	})
}

func FuzzParseCPUMax(f *testing.F) {
	for _, s := range []string{"max 100000\n", "20000 100000\n", "20000", "max max", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, p, err := parseCPUMax([]byte(s))
		if err != nil {
			return
		}
		out := strconv.FormatUint(q.Value, 10)
		if q.Unlimited {
			out = "max"
		}
		if q2, p2, err := parseCPUMax([]byte(out + " " + strconv.FormatUint(p, 10) + "\n")); err != nil || q2 != q || p2 != p {
			t.Fatalf("round trip of %+v %d: %+v %d %v", q, p, q2, p2, err)
		}
	})
}

func FuzzParseKeyedMap(f *testing.F) {
	for _, s := range []string{"low 0\nmax 1\noom 1\noom_kill 1\n", "oom_kill_disable 0\nunder_oom 0\n", "a x\n", "a 1 2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseKeyedMap([]byte(s))
		if err != nil {
			return
		}
		// Every key parseKeyed finds agrees with the map.
		for k, v := range m {
			if w, ok, err := parseKeyed([]byte(s), k); err != nil || !ok || w != v {
				t.Fatalf("key %q: map %d, parseKeyed %d %v %v", k, v, w, ok, err)
			}
		}
	})
}

func FuzzParsePressure(f *testing.F) {
	for _, s := range []string{
		"some avg10=6.55 avg60=10.03 avg300=18.25 total=375944898\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n", "some total=1 x\n", "full total=1\n", "", "some total=01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePressure([]byte(s))
		if err != nil {
			return
		}
		if p.Some == nil {
			t.Fatal("no some total without an error")
		}
		// Every total the parser gives is one of the input's total= values,
		// compared as numbers ("total=01" is 1).
		var totals []uint64
		for _, f := range strings.Fields(s) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				if n, err := strconv.ParseUint(v, 10, 64); err == nil {
					totals = append(totals, n)
				}
			}
		}
		if !slices.Contains(totals, *p.Some) {
			t.Fatalf("some total %d not among the input's %v", *p.Some, totals)
		}
		if p.Full != nil && !slices.Contains(totals, *p.Full) {
			t.Fatalf("full total %d not among the input's %v", *p.Full, totals)
		}
	})
}

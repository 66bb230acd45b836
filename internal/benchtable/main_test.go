package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkStatsWorkloadAgent/baseline-2    	   25114	     50000 ns/op	    3918 B/op	     110 allocs/op
BenchmarkStatsWorkloadAgent/unix-socket-2 	    7459	    150000 ns/op	   15676 B/op	     294 allocs/op
BenchmarkSweep/concurrency-8-2            	      15	  70000000 ns/op	        65.00 cpu-ms/op
BenchmarkSweep/baseline-2                 	       7	 140000000 ns/op
BenchmarkStatsWorkload-2                  	   30242	     35621 ns/op
BenchmarkStatsWorkloadCgroup/baseline-2   	    2000	    500000 ns/op
BenchmarkStatsWorkloadCgroup/unix-socket-2	    2500	    450000 ns/op	         1.300 goal-x	   28838 B/op	     389 allocs/op
BenchmarkNoBase/variant-2                 	    2500	    450000 ns/op	         1.300 goal-x
BenchmarkSlow/baseline-2                  	    2500	       100 ns/op
BenchmarkSlow/variant-2                   	    2500	       200 ns/op	         1.300 goal-x
PASS
`
	var out bytes.Buffer
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	rows := map[string]bool{}
	for _, line := range strings.Split(got, "\n") {
		rows[strings.Join(strings.Fields(line), " ")] = true
	}
	for _, want := range []string{
		"StatsWorkloadAgent unix-socket 150000 3x - 15676 B/op, 294 allocs/op",
		"Sweep concurrency-8 70000000 0.5x - 65.00 cpu-ms/op",
		"StatsWorkload 35621 - -",
		"StatsWorkloadCgroup unix-socket 450000 0.9x <=1.3x held 28838 B/op, 389 allocs/op",
		"StatsWorkloadAgent unix-socket 150000 3x - 15676 B/op, 294 allocs/op",
		"NoBase variant 450000 - <=1.3x no baseline",
		"Slow variant 200 2x <=1.3x MISSED",
		"Goals: 1 held, 2 missed: NoBase/variant (no baseline), Slow/variant (2x)",
	} {
		if !rows[want] {
			t.Errorf("table lacks the row %q:\n%s", want, got)
		}
	}
	if !strings.HasPrefix(got, "goos: linux\n") {
		t.Error("the benchmark output is not echoed first")
	}
}

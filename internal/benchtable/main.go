// Command benchtable turns `go test -bench` output into a table of ratios
// measured in one run. Absolute times on a noisy 2-core machine are not
// comparable between runs; ratios within one run are.
//
// Convention: a benchmark group has a sub-benchmark named "baseline" (a raw
// file read, a bare ttrpc round trip, runsc events --stats, ...); every other
// sub-benchmark of the same group is printed as a ratio to it. A variant
// declares the ratio it must stay under by reporting it as a metric of the
// unit "goal-x" (b.ReportMetric(1.3, "goal-x")): the table prints the goal
// beside the ratio, says whether it holds, and ends with the goals missed.
//
//	go test -run '^$' -bench . ./... | go run ./internal/benchtable
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

type result struct {
	group, variant string
	nsPerOp        float64
	goal           float64  // the ratio the variant must stay under; 0: none
	extra          []string // allocs/op and custom metrics, as printed
}

// goalUnit is the unit of the metric by which a variant declares its goal.
const goalUnit = "goal-x"

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	results, err := parse(in, out)
	if err != nil {
		return err
	}
	return printTable(out, results)
}

// parse echoes the benchmark output and collects the results.
func parse(in io.Reader, echo io.Writer) ([]result, error) {
	var results []result
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(echo, line)
		if r, ok := parseLine(line); ok {
			results = append(results, r)
		}
	}
	return results, sc.Err()
}

// parseLine reads "BenchmarkGroup/variant-2  1000  1234 ns/op  56 B/op ...".
func parseLine(line string) (result, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return result{}, false
	}
	name := strings.TrimPrefix(f[0], "Benchmark")
	if i := strings.LastIndex(name, "-"); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i]
		}
	}
	group, variant, _ := strings.Cut(name, "/")
	r := result{group: group, variant: variant}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return result{}, false
		}
		switch f[i+1] {
		case "ns/op":
			r.nsPerOp = v
		case goalUnit:
			r.goal = v
		default:
			r.extra = append(r.extra, f[i]+" "+f[i+1])
		}
	}
	return r, r.nsPerOp > 0
}

func printTable(out io.Writer, results []result) error {
	base := map[string]float64{}
	for _, r := range results {
		if r.variant == "baseline" {
			base[r.group] = r.nsPerOp
		}
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].group < results[j].group })
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Ratios measured in this run (variant ns/op / baseline ns/op of the same group):")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tVARIANT\tNS/OP\tRATIO\tGOAL\tOTHER")
	var missed []string
	held := 0
	for _, r := range results {
		ratio, goal := "-", "-"
		b, ok := base[r.group]
		if ok && b > 0 {
			ratio = fmt.Sprintf("%.3gx", r.nsPerOp/b)
		}
		if r.goal > 0 {
			switch {
			case !ok || b <= 0:
				goal = fmt.Sprintf("<=%.3gx no baseline", r.goal)
				missed = append(missed, r.group+"/"+r.variant+" (no baseline)")
			case r.nsPerOp/b <= r.goal:
				goal = fmt.Sprintf("<=%.3gx held", r.goal)
				held++
			default:
				goal = fmt.Sprintf("<=%.3gx MISSED", r.goal)
				missed = append(missed, fmt.Sprintf("%s/%s (%.3gx)", r.group, r.variant, r.nsPerOp/b))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\n", r.group, r.variant, r.nsPerOp, ratio, goal, strings.Join(r.extra, ", "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if held+len(missed) > 0 {
		fmt.Fprintf(out, "\nGoals: %d held, %d missed", held, len(missed))
		if len(missed) > 0 {
			fmt.Fprintf(out, ": %s", strings.Join(missed, ", "))
		}
		fmt.Fprintln(out)
	}
	return nil
}

package nodeagent

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/sandboxstats/sandboxstats/internal/process"
)

// droppedProcessMetrics are client_golang's process metrics the agent's
// collector does not export (processCollector's doc).
var droppedProcessMetrics = []string{"process_network_receive_bytes_total", "process_network_transmit_bytes_total"}

// gatherOne gathers c alone, by family name.
func gatherOne(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	return byName
}

// familyShape is what a scrape shows of a family but its value.
type familyShape struct {
	Help, Type string
	Labels     [][]string
}

func shapes(fams map[string]*dto.MetricFamily) map[string]familyShape {
	out := map[string]familyShape{}
	for name, f := range fams {
		s := familyShape{Help: f.GetHelp(), Type: f.GetType().String()}
		for _, m := range f.GetMetric() {
			var l []string
			for _, p := range m.GetLabel() {
				l = append(l, p.GetName()+"="+p.GetValue())
			}
			s.Labels = append(s.Labels, l)
		}
		out[name] = s
	}
	return out
}

func value(f *dto.MetricFamily) float64 {
	m := f.GetMetric()[0]
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestProcessCollectorAsClientGolang: on this process, the agent's process
// collector exports client_golang's process metrics but the two network
// ones, with the same names, help, types and labels, and values within
// what changes between two gathers.
func TestProcessCollectorAsClientGolang(t *testing.T) {
	ours := gatherOne(t, newProcessCollector(procRoot))
	theirs := gatherOne(t, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{ReportErrors: true}))
	for _, name := range droppedProcessMetrics {
		if theirs[name] == nil {
			t.Errorf("client_golang no longer exports %s: processCollector's doc and docs/statsagent.md name it", name)
		}
		delete(theirs, name)
	}
	if diff := cmp.Diff(shapes(theirs), shapes(ours)); diff != "" {
		t.Fatalf("process metrics (-client_golang +ours):\n%s", diff)
	}
	// Tolerances: what may change between the two gathers.
	tolerance := map[string]float64{
		"process_cpu_seconds_total":        0.5,      // s
		"process_open_fds":                 4,        // the gathers' own files
		"process_max_fds":                  0,        // the soft limit
		"process_virtual_memory_bytes":     64 << 20, // a thread's stack, a heap arena
		"process_virtual_memory_max_bytes": 0,
		"process_resident_memory_bytes":    16 << 20,
		"process_start_time_seconds":       0.011, // float rounding of boot + ticks
	}
	for name, f := range ours {
		tol, ok := tolerance[name]
		if !ok {
			t.Errorf("%s: no tolerance", name)
			continue
		}
		if got, want := value(f), value(theirs[name]); math.Abs(got-want) > tol {
			t.Errorf("%s = %v, client_golang's %v (tolerance %v)", name, got, want, tol)
		}
	}
}

// TestProcessCollectorFakeRoot reads a tree shaped like /proc: the values
// from self/stat, self/fd and stat's btime, the boot time read once, and a
// file missing leaves its metrics out.
func TestProcessCollectorFakeRoot(t *testing.T) {
	root := t.TempDir()
	self := filepath.Join(root, "self")
	if err := os.MkdirAll(filepath.Join(self, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(self, "fd", strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// utime 250, stime 50, starttime 1234 ticks, vsize 1 MiB, rss 10 pages.
	stat := "77 (statsagent) S 1 77 77 0 -1 0 0 0 0 0 250 50 0 0 20 0 9 0 1234 1048576 10 " + strings.Repeat("0 ", 27) + "0\n"
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(self, "stat"), stat)
	write(filepath.Join(root, "stat"), "cpu  1 2 3 4\nbtime 1700000000\n")
	c := newProcessCollector(root)
	values := func() map[string]float64 {
		out := map[string]float64{}
		for name, f := range gatherOne(t, c) {
			out[name] = value(f)
		}
		return out
	}
	page := float64(os.Getpagesize())
	want := map[string]float64{
		"process_cpu_seconds_total":     3,
		"process_virtual_memory_bytes":  1 << 20,
		"process_resident_memory_bytes": 10 * page,
		"process_start_time_seconds":    1700000000 + 12.34,
		"process_open_fds":              3,
	}
	got := values()
	delete(got, "process_max_fds") // getrlimit's: TestProcessCollectorAsClientGolang
	delete(got, "process_virtual_memory_max_bytes")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}

	write(filepath.Join(root, "stat"), "btime 1800000000\n") // a wall-clock step
	if got, want := values()["process_start_time_seconds"], 1800000000+12.34; got != want {
		t.Errorf("start time %v after /proc/stat changed, want %v: the boot time is read each scrape", got, want)
	}
	os.Remove(filepath.Join(root, "stat"))
	if _, ok := values()["process_start_time_seconds"]; ok {
		t.Error("start time exported without /proc/stat")
	}
	write(filepath.Join(root, "stat"), "btime 1800000000\n") // a failed read is not kept
	if _, ok := values()["process_start_time_seconds"]; !ok {
		t.Error("start time not exported again once /proc/stat reads")
	}

	if err := os.Remove(filepath.Join(self, "stat")); err != nil {
		t.Fatal(err)
	}
	got = values()
	for _, name := range []string{"process_cpu_seconds_total", "process_virtual_memory_bytes", "process_resident_memory_bytes", "process_start_time_seconds"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s exported without self/stat", name)
		}
	}
	if got["process_open_fds"] != 3 {
		t.Errorf("process_open_fds = %v without self/stat, want 3", got["process_open_fds"])
	}
}

// TestClockBootTime: the clocks give the kernel's btime (a second apart at
// most: the kernel truncates the same difference).
func TestClockBootTime(t *testing.T) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Skipf("no /proc/stat: %v", err)
	}
	want, err := process.ParseBootTime(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := clockBootTime()
	if err != nil {
		t.Fatal(err)
	}
	if d := int64(got) - int64(want); d < -1 || d > 1 {
		t.Errorf("clockBootTime %d, /proc/stat's btime %d", got, want)
	}
}

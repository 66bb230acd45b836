package nodeagent

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int // 0: an error
	}{
		{"0\n", 1},
		{"0-3\n", 4},
		{"0-3,8-11\n", 8},
		{"0,2,4-5", 4},
		{"0-127\n", 128},
		{"1-1", 1},
		{"", 0},
		{"\n", 0},
		{"0-", 0},
		{"-3", 0},
		{"3-1", 0},
		{"0-3,2-5", 0}, // overlapping
		{"4,0", 0},     // not ascending
		{"0,,1", 0},
		{"0-3 ", 0},
		{"+1", 0},
		{"0x10", 0},
		{"0-99999999", 0},
		{"0-3\n\n", 0},
	} {
		got, err := parseCPUList([]byte(tc.in))
		if got != tc.want || (err != nil) != (tc.want == 0) {
			t.Errorf("parseCPUList(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0\n", "0-3,8-11\n", "0,2,4-5", "3-1", "", "0-65536"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseCPUList(b)
		if err == nil && (n < 1 || n > maxCPUID+1) {
			t.Errorf("parseCPUList(%q) = %d with no error", b, n)
		}
		if err != nil && n != 0 {
			t.Errorf("parseCPUList(%q) = %d with %v", b, n, err)
		}
	})
}

// TestNodeCPUsBound: the body bound uses the node's online CPUs (the list
// file), not the agent's runtime.NumCPU (its affinity): 30 CPUs' worth of
// growth in a minute on a 64-CPU node is charged; with the file
// unreadable, runtime.NumCPU is the fallback.
func TestNodeCPUsBound(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "online")
	if err := os.WriteFile(list, []byte("0-63\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := nodeCPUs(list); n != 64 || err != nil {
		t.Errorf("nodeCPUs = %d, %v; want 64", n, err)
	}
	if n, err := nodeCPUs(filepath.Join(dir, "missing")); n != runtime.NumCPU() || err == nil {
		t.Errorf("nodeCPUs of a missing file = %d, %v; want runtime.NumCPU() %d and the error", n, err, runtime.NumCPU())
	}
	if runtime.NumCPU() >= 31 {
		t.Skipf("%d CPUs here: the affinity bound would allow the growth too", runtime.NumCPU())
	}
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	m, err := newMetrics(reg, metricsConfig{Grace: 5 * time.Minute, Started: t0, CPUOnlinePath: list}, discard())
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]sweep.DaemonResult{okResult("1", sample("busy", 1_000_000, 1))}, t0, 0)
	m.Apply([]sweep.DaemonResult{okResult("1", sample("busy", 1_000_000+30*60_000_000, 1))}, t0.Add(time.Minute), 0)
	if diff := cmp.Diff(map[string]float64{lCgroup: 1800}, pick(gather(t, reg), metricCPUSeconds), approx()); diff != "" {
		t.Errorf("30 CPUs for a minute on a 64-CPU node (-want +got):\n%s", diff)
	}
}

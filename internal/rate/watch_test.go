package rate

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// watchSequence is one workload watched every 2 s through the cases a
// terminal user meets.
func watchSequence() []*sandboxstatsv1.WorkloadStatsSample {
	e2 := base.Add(30e9)
	return []*sandboxstatsv1.WorkloadStatsSample{
		smp(0, 10_000_000),                              // first sight: no rate
		smp(2, 11_000_000),                              // 1 s of CPU in 2 s: 0.500 cores
		smp(4, 13_000_000, mem(300<<20, 250<<20)),       // 1.000 cores; memory grew
		smp(6, 0, src(unspec)),                          // not measured: all absent
		smp(8, 14_000_000, mem(50<<20, 40<<20)),         // rated over 4 s: 0.250; memory dropped, shown as read
		smp(8, 14_500_000),                              // identical timestamp: no rate
		smp(10, 200_000),                                // counter decreased: reset
		smp(32, 300_000, epoch(e2), noPeak),             // restore: epoch reset, peak absent
		smp(34, 700_000, epoch(e2), noPeak),             // 0.200 cores
		smp(36, 700_000, epoch(e2), noPeak, src(guest)), // another layer: not comparable
	}
}

func TestWatcherGolden(t *testing.T) {
	var w Watcher
	var rows []Row
	for _, s := range watchSequence() {
		rows = append(rows, w.Observe(s))
	}
	for _, tc := range []struct {
		file  string
		write func(*bytes.Buffer, []Row) error
	}{
		{"watch.table.golden", func(b *bytes.Buffer, r []Row) error { return WriteWatchTable(b, r) }},
		{"watch.jsonl.golden", func(b *bytes.Buffer, r []Row) error { return WriteWatchJSON(b, r) }},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var got bytes.Buffer
			if err := tc.write(&got, rows); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, got.Bytes())
		})
	}
}

func TestWatcherNeverNegative(t *testing.T) {
	var w Watcher
	for i, s := range watchSequence() {
		r := w.Observe(s)
		if r.CPUCores != nil && *r.CPUCores < 0 {
			t.Errorf("row %d: negative rate %v", i, *r.CPUCores)
		}
		if (r.CPUCores == nil) != (r.Event != EventNone) {
			t.Errorf("row %d: rate %v with event %q: a row has a rate exactly when it has no event", i, r.CPUCores, r.Event)
		}
	}
}

// golden compares got with testdata/name, rewriting it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

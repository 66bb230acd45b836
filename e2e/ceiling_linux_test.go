package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestCeilingOfOneStatsd: one statsd at its documented ceiling,
// --max-workloads 64, with 64 workloads bound by --cgroup-path to 64 real
// cgroups (a process each), polled by statsagent: every workload's series
// is on its /metrics, and on `statsctl poll`'s table. On a v1 host the
// discovery answer holds 41 to 53 of the 64 samples (each about 1.1 KiB,
// its absent list the most of it) and lists the rest as pending
// ANSWER_FULL, which the poller reads with StatsWorkload
// (internal/sweep/answerfull.go); before, those workloads were never
// exported.
func TestCeilingOfOneStatsd(t *testing.T) {
	needCgroups(t)
	const n = 64
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	parent := fmt.Sprintf("/sbs-ceiling-%d", os.Getpid())
	testCgroup(t, parent)
	var cgs []string
	for i := range n {
		cg := fmt.Sprintf("%s/pod-%02d", parent, i)
		testCgroup(t, cg)
		cgs = append(cgs, cg)
	}
	for _, cg := range cgs { // after the cgroups: killed before their rmdir
		cmd := exec.Command("sleep", "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		moveTo(t, cg, cmd.Process.Pid)
	}
	d := startStatsdIn(t, bin, dir, "a", "--max-workloads", fmt.Sprint(n))
	var actors []string
	for i, cg := range cgs {
		actor := fmt.Sprintf("ceiling-%02d", i)
		statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor, "--actor-name", actor,
			"--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", "py", "--cgroup-path", cg)
		actors = append(actors, actor)
	}
	// What the discovery answer itself left out.
	var active struct {
		Samples []json.RawMessage `json:"samples"`
		Pending []struct {
			Reason string `json:"reason"`
		} `json:"pending"`
	}
	out := statsctl(t, bin, "active", "--socket", d.Stats, "-o", "json")
	if err := json.Unmarshal(out, &active); err != nil {
		t.Fatalf("statsctl active -o json: %v", err)
	}
	full := 0
	for _, p := range active.Pending {
		if p.Reason == "ERROR_REASON_ANSWER_FULL" {
			full++
		}
	}
	t.Logf("the discovery answer: %d samples, %d pending (%d ANSWER_FULL)", len(active.Samples), len(active.Pending), full)
	if full == 0 {
		t.Fatal("no workload left out of the discovery answer (ANSWER_FULL): this test no longer exercises the poller's reads on their own; make the samples larger")
	}

	start := time.Now()
	base := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", "1s", "--min-interval", "100ms", "--timeout", "5s", "--label-actor")
	m := testenv.WaitSweeps(t, base, 2)
	var exported []string
	for _, a := range actors {
		if _, ok := m["sandboxstats_workload_memory_current_bytes"+series(a, "gvisor", "cgroup")]; ok {
			exported = append(exported, a)
		}
	}
	if diff := cmp.Diff(actors, exported); diff != "" {
		t.Errorf("statsagent's /metrics after two sweeps (-bound +exported):\n%s", diff)
	}
	t.Logf("statsagent: %d of %d workloads exported %v after its start; last sweep %.3f s",
		len(exported), n, time.Since(start).Round(time.Millisecond), m["sandboxstats_agent_last_sweep_duration_seconds{}"])

	// statsctl poll: one ok line per workload.
	table := statsctl(t, bin, "poll", "--sockets", filepath.Join(dir, "stats", "*.sock"))
	var polled []string
	for line := range strings.SplitSeq(string(table), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "ok" {
			polled = append(polled, f[2])
		}
	}
	slices.Sort(polled)
	if diff := cmp.Diff(actors, polled); diff != "" {
		t.Errorf("statsctl poll (-bound +polled):\n%s\n%s", diff, table)
	}
}

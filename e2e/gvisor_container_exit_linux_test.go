package e2e

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationGVisorContainerExitKeepsCPU: a real runsc pod (busy
// burning a short loop, idle sleeping) bound to a real statsd started with
// --runsc-root, the idle container named through the binding (run-workload
// --container id=name: the binding's name wins over the CRI annotation).
// `runsc delete` of the idle container mid-activation: the next `statsctl
// stats` carries it exited with its CPU as last read (exactly the figure
// of the last sample that listed it), its gauges absent; the same
// activation and epoch; CheckpointWorkload's final carries it too.
func TestIntegrationGVisorContainerExitKeepsCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor pod and statsd; not under -short")
	}
	start := time.Now()
	p := testenv.StartRunscPod(t, []string{"busy", "idle"}, map[string][]string{
		"busy": {"sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 100000"},
		"idle": {"sleep", "100000"},
	})
	bin := testenv.BuildBinaries(t)
	d := testenv.StartStatsd(t, bin, "--runsc-root", p.Root)
	const actor = "e2e-gvisor-container-exit"
	idle := p.IDs[2]
	statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor,
		"--class", "gvisor", "--sentry-pid", strconv.Itoa(p.SentryPID(t)), "--container", idle+"=sleeper")
	type container struct {
		ID     string `json:"id"`
		Name   string `json:"name"`
		CPU    string `json:"cpu_usage_usec"`
		Exited bool   `json:"exited"`
		Absent []struct {
			Field  string `json:"field"`
			Reason string `json:"reason"`
		} `json:"absent"`
	}
	type sample struct {
		Epoch      string      `json:"epoch_unix_nano"`
		CPU        string      `json:"cpu_usage_usec"`
		Own        string      `json:"sandbox_own_cpu_usec"`
		Containers []container `json:"containers"`
	}
	find := func(s sample) *container {
		for i := range s.Containers {
			if s.Containers[i].ID == idle {
				return &s.Containers[i]
			}
		}
		return nil
	}
	stats := func() sample {
		t.Helper()
		var s sample
		out := statsctl(t, bin, "stats", "--socket", d.Stats, "--actor-uid", actor, "-o", "json")
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
		}
		return s
	}
	// A sample that lists the idle container with its CPU: the last read
	// before the delete (nothing else reads this binding).
	var before sample
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		before = stats()
		if c := find(before); c != nil && c.CPU != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle container never listed with its CPU: %+v", before)
		}
	}
	last := find(before)
	if last.Name != "sleeper" || last.Exited {
		t.Errorf("before the delete: %+v, want named sleeper (the binding's), not exited", *last)
	}
	p.Remove(t, idle)
	deleted := time.Now()
	var after sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = stats()
		c := find(after)
		if c != nil && c.Exited {
			break
		}
		if c != nil {
			last = c // still listed (the state file not gone yet): a newer last read
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted container not exited within 10 s: %+v", after)
		}
	}
	got := find(after)
	t.Logf("exited %s after the delete: %+v (last read %s us)", time.Since(deleted).Round(time.Millisecond), *got, last.CPU)
	if got.CPU != last.CPU || got.Name != "sleeper" || after.Epoch != before.Epoch {
		t.Errorf("exited container %+v, epoch %s: want its last CPU %s, its name, epoch %s", *got, after.Epoch, last.CPU, before.Epoch)
	}
	var gauges []string
	for _, a := range got.Absent {
		if a.Reason == "exited" {
			gauges = append(gauges, a.Field)
		}
	}
	if strings.Join(gauges, ",") != "memory_current_bytes,memory_working_set_bytes,pids_current" {
		t.Errorf("absent for exiting: %v", gauges)
	}
	// statsd crashes (the exit's write holds the split's state) and is
	// stopped: the split goes on from its state, no container's CPU goes
	// down and the containers plus own stay the cgroup's CPU.
	prev := after
	for _, restart := range []func(testing.TB){d.Crash, d.Restart} {
		time.Sleep(300 * time.Millisecond) // the exit's (or the shutdown's) write
		if b, err := os.ReadFile(filepath.Join(d.StateDir, "binding.json")); err != nil || !strings.Contains(string(b), `"split_usec"`) {
			t.Errorf("binding.json without the split's state (%v)", err)
		}
		restartAt := time.Now()
		restart(t)
		t.Logf("restarted in %s", time.Since(restartAt).Round(time.Millisecond))
		s := stats()
		var sum uint64
		for _, c := range s.Containers {
			v, _ := strconv.ParseUint(c.CPU, 10, 64)
			sum += v
			for _, o := range prev.Containers {
				if w, _ := strconv.ParseUint(o.CPU, 10, 64); o.ID == c.ID && v < w {
					t.Errorf("after a restart %s's CPU %d us, was %d", c.ID, v, w)
				}
			}
		}
		own, _ := strconv.ParseUint(s.Own, 10, 64)
		cg, _ := strconv.ParseUint(s.CPU, 10, 64)
		t.Logf("after a restart: containers %d us + own %d us = %d us, cgroup %d us", sum, own, sum+own, cg)
		// 1%, or 30 ms: the sentry's and gofers' /proc figures (read beside
		// the cgroup) lead its cpuacct by up to a 10 ms tick each.
		if d := math.Abs(float64(sum+own) - float64(cg)); d > max(0.01*float64(cg), 30_000) {
			t.Errorf("containers %d + own %d us, %.2f%% from the cgroup's %d us", sum, own, 100*d/float64(cg), cg)
		}
		prev = s
	}
	statsctl(t, bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", actor)
	var ended struct {
		Ended []struct {
			Final sample `json:"final"`
		} `json:"ended"`
	}
	out := statsctl(t, bin, "activations", "--socket", d.Stats, "-o", "json")
	if err := json.Unmarshal(out, &ended); err != nil || len(ended.Ended) != 1 {
		t.Fatalf("statsctl activations -o json: %v\n%s", err, out)
	}
	if c := find(ended.Ended[0].Final); c == nil || !c.Exited || c.CPU != last.CPU {
		t.Errorf("the final's idle container %+v, want exited with CPU %s", c, last.CPU)
	}
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

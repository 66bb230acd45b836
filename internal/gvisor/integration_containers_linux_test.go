package gvisor

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationGVisorContainers reads a real pod (a sandbox and two
// containers joined by the CRI annotations: busy burns about 1.5M shell
// loop iterations then sleeps, idle sleeps) through the source statsd
// reads, bound by sentry pid, with the pod's runsc root: each container's
// CPU is within 5% of `runsc events --stats` for it, and the containers'
// sum within 1% of the sandbox cgroup's CPU of the same sample. Then idle
// is removed while the source stays open.
func TestIntegrationGVisorContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor pod; not under -short")
	}
	p := testenv.StartRunscPod(t, []string{"busy", "idle"}, map[string][]string{
		"busy": {"sh", "-c", "i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done; exec sleep 100000"},
		"idle": {"sleep", "100000"},
	})
	busy, idle := p.IDs[1], p.IDs[2]
	ref := source.SandboxRef{Class: source.ClassGVisor, SentryPID: p.SentryPID(t)}
	s, err := Open(ref, Config{Logger: discard(), RunscRoots: []string{p.Root}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	cpuOf := func(r source.Reading, id string) (uint64, bool) {
		for _, c := range r.Containers {
			if c.ID == id && c.CPUUsageUsec != nil {
				return *c.CPUUsageUsec, true
			}
		}
		return 0, false
	}

	// Until the burner is done: its CPU within 0.5% in two samples 500ms
	// apart.
	var r source.Reading
	var last uint64
	deadline := time.Now().Add(60 * time.Second)
	for {
		if r, err = s.Sample(ctx); err != nil {
			t.Fatal(err)
		}
		v, ok := cpuOf(r, busy)
		if ok && v > 100_000 && math.Abs(float64(v)-float64(last)) < 0.005*float64(v) {
			break
		}
		last = v
		if time.Now().After(deadline) {
			t.Fatalf("the burner did not settle in 60s: containers %+v, absent %v", r.Containers, r.Absent)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var names []string
	var sum uint64
	for _, c := range r.Containers {
		names = append(names, c.Name)
		if c.CPUUsageUsec != nil {
			sum += *c.CPUUsageUsec
		}
	}
	if !slices.Equal(names, []string{"busy", "idle"}) {
		t.Errorf("containers named %q, want busy, idle (the pause container left out)", names)
	}
	host := *r.CPUUsageUsec
	t.Logf("sandbox cgroup %d us; containers' sum %d us (%.3f%% apart)", host, sum, 100*math.Abs(float64(host)-float64(sum))/float64(host))
	if math.Abs(float64(host)-float64(sum)) > 0.01*float64(host) {
		t.Errorf("containers' sum %d us, sandbox cgroup %d us: more than 1%% apart", sum, host)
	}
	if r.SandboxOwnCPUUsec != nil {
		t.Errorf("sandbox_own_cpu_usec %d: not measured yet, want absent", *r.SandboxOwnCPUUsec)
	}
	for _, id := range []string{busy, idle} {
		got, ok := cpuOf(r, id)
		cli, _, _ := p.Events(t, id)
		diff := math.Abs(float64(got)*1000-float64(cli)) / float64(cli)
		t.Logf("%s: statsd %d us, runsc events %d ns: %.2f%% apart", id, got, cli, 100*diff)
		if !ok || diff > 0.05 {
			t.Errorf("%s: %d us (found %v) from statsd, %d ns from runsc events: %.1f%% apart, want <= 5%%", id, got, ok, cli, 100*diff)
		}
	}

	// Cost: a sample with the breakdown against one without (medians).
	plain, err := Open(ref, Config{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	timeIt := func(src source.Source) time.Duration {
		var d []time.Duration
		for range 11 {
			start := time.Now()
			if _, err := src.Sample(ctx); err != nil {
				t.Fatal(err)
			}
			d = append(d, time.Since(start))
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	with, without := timeIt(s), timeIt(plain)
	t.Logf("one Sample: %v with the breakdown, %v without (%.2fx)", with, without, float64(with)/float64(without))

	// A container removed while the source is open: the next sample no
	// longer lists it (its state file is gone; the source keeps no
	// history of a container), the others read on.
	p.Remove(t, idle)
	if r, err = s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := cpuOf(r, idle); ok {
		t.Errorf("the removed container is still listed: %+v", r.Containers)
	}
	if _, ok := cpuOf(r, busy); !ok {
		t.Errorf("busy lost after idle's removal: containers %+v, absent %v", r.Containers, r.Absent)
	}
	var after []string
	for _, c := range r.Containers {
		after = append(after, c.Name)
	}
	t.Logf("after removing idle: containers %s; absent %v", strings.Join(after, ","), r.Absent)
}

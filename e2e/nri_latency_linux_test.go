package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// median of durations.
func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestIntegrationNRIPodStartLatency: pod start latency (crictl runp's wall
// time, runc pods) with the bridge connected against without any NRI
// plugin, measured in one run, interleaved (blocks of without, with, with,
// without: the bridge started, synchronized and idle before the pods with
// it, stopped before those without; each pod removed once measured,
// untimed): the median with it is within 1.1x of the median without, over
// 24 pods each way (pooled with further rounds of 8, up to 40, while it is
// not: one pod's start varies by tens of percent on this shared machine).
// Every process of the path runs at nice -20.
// Then with every statsd hung (SIGSTOP), interleaved again (with, without,
// without, with; the pods kept; 12 each way, up to 18): the bridge answers
// NRI at once, so pods still start on time (median within 1.1x); once the
// statsd run again (SIGCONT) the bridge connected then binds every pod made
// meanwhile.
func TestIntegrationNRIPodStartLatency(t *testing.T) {
	const bound = 1.1
	// Every process of the path at nice -20 (containerd, its shims and
	// runc, crictl, the statsd, the bridge: all inherit the test's), so
	// that the comparison measures the bridge and not the waits for a CPU
	// the machine's other tenants impose on each extra process hop.
	t.Cleanup(testenv.FavorProcess(t, os.Getpid()))
	r := startNRIRig(t, "--call-timeout", "2s")
	var binds []time.Duration // bind latency of the pods made with the bridge, statsd running
	// measure starts a runc pod per entry of pattern (true: with the
	// bridge) blocks times; the bridge is started or stopped only where
	// the pattern changes, and left as the last entry wants it.
	measure := func(phase string, pattern []bool, blocks int, hung, remove bool) (with, without []time.Duration, pods []*nriPod) {
		for blk := range blocks {
			for k, on := range pattern {
				switch {
				case on && !r.bridge.running():
					r.bridge.start(t)
					r.bridge.waitHealthy(t, 10*time.Second)
					// Its start's own work (the runtime, the Go
					// runtime, listing every statsd) is not what a pod
					// pays a running bridge.
					time.Sleep(250 * time.Millisecond)
				case !on && r.bridge.running():
					r.bridge.stop(t)
				}
				if on && !hung {
					r.bridge.waitIdle(t, 10*time.Second)
				}
				p := r.runDefaultPod(t, fmt.Sprintf("%s-%d-%d", phase, blk, k))
				if on {
					with = append(with, p.took)
				} else {
					without = append(without, p.took)
				}
				if on && !hung {
					binds = append(binds, r.waitBound(t, 5*time.Second, p)[p.uid])
				}
				if remove {
					r.c.StopPod(t, p.id)
					r.c.RemovePod(t, p.id)
				} else {
					pods = append(pods, p)
				}
			}
		}
		return with, without, pods
	}
	// compare measures rounds of blocks until the median with the bridge is
	// within bound of the median without, over every pod measured so far
	// (at least minRounds, at most maxRounds: on this shared, loaded
	// machine one pod's start varies by tens of percent, and more pods
	// narrow the medians; a real cost of the bridge stays in them).
	compare := func(what, phase string, pattern []bool, blocks, minRounds, maxRounds int, hung, remove bool) []*nriPod {
		var with, without []time.Duration
		var pods []*nriPod
		for round := 1; ; round++ {
			w, wo, ps := measure(fmt.Sprintf("%s%d", phase, round), pattern, blocks, hung, remove)
			with, without, pods = append(with, w...), append(without, wo...), append(pods, ps...)
			if round < minRounds {
				continue
			}
			ratio := float64(median(with)) / float64(median(without))
			t.Logf("%s: median %v with the bridge, %v without: ratio %.3f (%d pods each way, %d rounds)\n  with    %v\n  without %v", what,
				median(with).Round(time.Millisecond), median(without).Round(time.Millisecond), ratio, len(with), round, roundAll(with), roundAll(without))
			if ratio <= bound {
				return pods
			}
			if round == maxRounds {
				t.Errorf("%s: pods start %.3fx slower with the bridge (median %v against %v over %d pods each way), want at most %.1fx",
					what, ratio, median(with), median(without), len(with), bound)
				return pods
			}
		}
	}
	compare("pod start latency, the bridge connected against no plugin", "lat", []bool{false, true, true, false}, 4, 3, 5, false, true)
	t.Logf("bind latency of the pods made with the bridge (after crictl runp returned): median %v, max %v", median(binds).Round(time.Millisecond), slices.Max(binds).Round(time.Millisecond))

	for _, d := range r.shards {
		if err := d.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	pods := compare("pod start latency, every statsd stopped (SIGSTOP)", "hung", []bool{true, false, false, true}, 3, 2, 3, true, false)
	if !r.bridge.running() {
		t.Fatal("the pattern ends with the bridge connected")
	}
	nm := r.bridge.metrics(t)
	var pending float64
	for k, v := range nm {
		if strings.HasPrefix(k, "sandboxstats_nri_statsd_pending{") {
			pending += v
		}
	}
	cont := time.Now()
	for _, d := range r.shards {
		if err := d.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	r.waitBound(t, 30*time.Second, pods...)
	t.Logf("every statsd stopped for %v: %v pods waiting in the bridge; once running again (SIGCONT) the %d pods made meanwhile were bound within %v",
		cont.Sub(stopped).Round(time.Millisecond), pending, len(pods), time.Since(cont).Round(time.Millisecond))
	nm = r.bridge.metrics(t)
	var failed []string
	for k, v := range nm {
		if strings.HasPrefix(k, "sandboxstats_nri_statsd_calls_total{") && !strings.Contains(k, "result=ok") {
			failed = append(failed, fmt.Sprintf("%s %v", strings.TrimPrefix(k, "sandboxstats_nri_statsd_calls_total"), v))
		}
	}
	slices.Sort(failed)
	t.Logf("the last bridge's failed statsd calls: %v", failed)
}

func roundAll(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond)
	}
	return out
}

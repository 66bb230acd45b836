package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Where in the agent's cycle a kill is aimed.
const (
	killMidExport = "mid-export"     // events in flight to the sink
	killQueued    = "events queued"  // the sink down and events waiting in the agent's queue
	killBetween   = "between sweeps" // about half an interval after a sweep completed
	killRandom    = "random"         // anywhere in an interval
)

// killPlan is one SIGKILL of the kill loop.
type killPlan struct {
	how      string
	up, down time.Duration // how long the life runs before the kill is aimed; how long the agent stays down after it
}

// killLoop is the size of a kill loop: the activations each statsd's lane
// runs at least (it goes on until the kills are done), the kills in order,
// the kill (by index) in whose down time the sink is killed, the one after
// whose restart it is started again, and the lane whose statsd restarts
// before which of its activations.
type killLoop struct {
	perLane                int
	kills                  []killPlan
	sinkDownAt, sinkUpAt   int
	restartLane, restartAt int
}

// hostKillLoop is the host's: at least 42 activations, ten kills (two of
// them leaving the agent down for 4 and 5 intervals), the Collector
// SIGKILLed in the first of these and started again after the two kills
// that follow (with events queued). The places of the other kills, the
// short downs and the lives' lengths are drawn from rng.
func hostKillLoop(rng *rand.Rand) killLoop {
	free := []string{killMidExport, killMidExport, killMidExport, killBetween, killBetween, killRandom, killRandom, killRandom}
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	hows := slices.Concat(free[:3], []string{killQueued, killQueued}, free[3:])
	k := killLoop{perLane: 14, sinkDownAt: 2, sinkUpAt: 4, restartLane: 2, restartAt: 6}
	for i, how := range hows {
		p := killPlan{how: how, up: churnInterval + randUpTo(rng, churnInterval), down: randUpTo(rng, 400*time.Millisecond)}
		switch i {
		case 2:
			p.down = 4 * churnInterval
		case 7:
			p.down = 5 * churnInterval
		}
		k.kills = append(k.kills, p)
	}
	return k
}

// vmKillLoop is the VM lane's short form (QEMU TCG is slow): three
// activations a lane, three kills, one leaving the agent down 3 intervals
// and the sink killed.
func vmKillLoop(rng *rand.Rand) killLoop {
	return killLoop{perLane: 3, sinkDownAt: 0, sinkUpAt: 1, restartLane: 1, restartAt: 1, kills: []killPlan{
		{how: killMidExport, up: churnInterval, down: 3 * churnInterval},
		{how: killQueued, up: churnInterval, down: randUpTo(rng, 300*time.Millisecond)},
		{how: killBetween, up: churnInterval, down: randUpTo(rng, 300*time.Millisecond)},
	}}
}

// TestIntegrationAgentRestartsKillLoop is issue 30's kill loop on real
// cgroups: three statsd and a churn of activations burning known CPU
// (e2e/churn_linux_test.go), polled by statsagent with --state-dir pushing
// OTLP to the real Collector (on a Unix socket) and scraped every 0.5 s by
// the real Prometheus. The agent is SIGKILLed ten times at drawn places
// (with an export in flight to the Collector, paused by SIGSTOP; between
// sweeps; anywhere; with events queued while the Collector is down),
// restarted on the same arguments and state, left down 4 and 5 intervals
// once each; the Collector is SIGKILLed and started again once, one statsd
// restarted. Afterwards, deduplicated by log.record.uid: every activation
// has exactly one final and at most one initial (the duplicate sends
// counted and explained by the lives that sent them), and the finals' CPU
// equals the cgroups' own within 1%; so do the agent's CPU counter, the
// Collector's latest container.cpu.time (one start time over every life)
// and Prometheus' increase() over the whole run, the restarts in it, with
// no reset. 45-50 s (on a loaded machine; the seed drawing the plan
// is logged).
//
// In the cgroup v2 VM lane's guest (no Collector, no Prometheus) it runs a
// short form: about twenty activations (three a lane at least, more while
// the kills last), three kills, an in-process OTLP receiver, the agent's
// own counter for Prometheus'; about 20 s in the guest.
func TestIntegrationAgentRestartsKillLoop(t *testing.T) {
	needCgroups(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	plan, short := hostKillLoop(rng), testenv.InVMLane()
	if short {
		plan = vmKillLoop(rng)
	}
	t.Logf("seed %d: %d kills %+v", seed, len(plan.kills), plan.kills)
	began := time.Now()

	c := &churn{bin: testenv.BuildBinaries(t, "statsagent"), dir: fleetDir(t), truth: map[string]uint64{}}
	c.actLog = filepath.Join(c.dir, "activations.jsonl")
	socket := filepath.Join(t.TempDir(), "otlp.sock")
	var sink eventSink
	if short {
		sink = startOTLPSink(t, socket)
	} else {
		sink = collectorSink{testenv.StartCollector(t, testenv.WithCollectorSocket(socket))}
	}
	stateDir := filepath.Join(c.dir, "agent-state")
	agent := startAgentLives(t, c.bin, c.dir, "--sockets", filepath.Join(c.dir, "stats", "*.sock"), "--interval", churnInterval.String(),
		"--min-interval", "100ms", "--timeout", "5s", "--grace", "2m", "--activation-log", c.actLog,
		"--otlp-endpoint", "unix://"+socket, "--otlp-periodic-every", "1", "--state-dir", stateDir)
	c.agentURL = agent.url()
	if !short {
		c.prom = testenv.StartPrometheus(t, []string{agent.addr}, 500*time.Millisecond)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(stateDir, "agent-state.json"))
			t.Logf("%s at the end (%d bytes), its first 4 KiB:\n%s", stateDir, len(b), b[:min(len(b), 4096)])
		}
	})
	var daemons []*testenv.Statsd
	for _, name := range []string{"a", "b", "c"} {
		daemons = append(daemons, startStatsdIn(t, c.bin, c.dir, name))
	}
	zeroActivation(t, c, daemons[0])

	chaosDone := make(chan struct{})
	var kills []string // what each kill hit, and what befell the sink, for the log
	killed := 0
	go func() {
		// t.Fatal from this goroutine would end only it: errors are
		// reported with t.Error and end the chaos.
		defer close(chaosDone)
		for i, k := range plan.kills {
			time.Sleep(k.up)
			what, err := killAt(agent, sink, k.how, rng)
			if err != nil {
				t.Errorf("kill %d (%s): %v", i, k.how, err)
				return
			}
			killed++
			kills = append(kills, fmt.Sprintf("kill %d (%s, %s) then down %v", i, k.how, what, k.down.Round(time.Millisecond)))
			if i == plan.sinkDownAt {
				// The test's Collector acknowledges a batch before its
				// batch processor (100 ms) writes it: killed while the
				// agent sends, it would lose acknowledged events (the
				// node Collector's persistent queue is deploy/otel's, and
				// its own test's). Killed 500 ms into the agent's down
				// time, it holds nothing unwritten.
				time.Sleep(500 * time.Millisecond)
				sink.kill(t)
				k.down -= 500 * time.Millisecond
				kills = append(kills, "  the sink killed 500 ms into that down time")
			}
			time.Sleep(k.down)
			if err := agent.start(); err != nil {
				t.Errorf("restart after kill %d: %v", i, err)
				return
			}
			if i == plan.sinkUpAt {
				sink.Start(t)
				kills = append(kills, "  the sink started again after that restart")
			}
		}
	}()
	t.Run("churn", func(t *testing.T) {
		// The lanes' subtests run at once from goroutines (t.Parallel
		// would run at most GOMAXPROCS of them at once: 2 on CI's machine).
		lifetimes := []float64{0.25, 1, 3, 0.5, 2, 1.5, 0.3, 2.5, 0.75}
		var lanes sync.WaitGroup
		defer lanes.Wait()
		for i, d := range daemons {
			lanes.Go(func() {
				t.Run(fmt.Sprint("statsd-", i), func(t *testing.T) { churnLane(t, c, d, i, plan, chaosDone, lifetimes) })
			})
		}
	})
	<-chaosDone
	t.Logf("%d kills in %v:\n%s", killed, time.Since(began).Round(time.Second), strings.Join(kills, "\n"))
	if t.Failed() {
		return
	}
	testenv.WaitNewSweeps(t, c.agentURL) // the last ends seen ...
	testenv.WaitNewSweeps(t, c.agentURL) // ... and charged, the events queued
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if n, ok := agentGauge(c.agentURL, "sandboxstats_agent_otlp_queue_records"); ok && n == 0 || time.Now().After(deadline) {
			break
		}
	}
	truth, n := c.truthSum()
	actors := c.actors()
	var events []sentEvent
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		events = sink.events(t)
		if finals := dedupSends(events).finals; len(finals) >= n || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("%d activations in %v, %d agent lives", n, time.Since(began).Round(time.Second), len(agent.lives))
	checkSends(t, agent, dedupSends(events), actors, truth)
	checkCounter(t, c, sink, began, truth)
}

// churnLane runs activations of statsd d (lane i) until the kills are done
// and it ran at least plan.perLane, restarting d before its activation
// plan.restartAt if it is plan.restartLane.
func churnLane(t *testing.T, c *churn, d *testenv.Statsd, i int, plan killLoop, chaosDone <-chan struct{}, lifetimes []float64) {
	for j := 0; ; j++ {
		select {
		case <-chaosDone:
			if j >= plan.perLane {
				return
			}
		default:
		}
		if i == plan.restartLane && j == plan.restartAt {
			d.Restart(t)
			t.Logf("statsd %d restarted", i)
		}
		lifetime := time.Duration(lifetimes[(i*4+j)%len(lifetimes)] * float64(churnInterval))
		c.activation(t, d, fmt.Sprintf("restarts-%d-%d", i, j), lifetime, anytime)
	}
}

// zeroActivation runs an activation of an empty cgroup (no CPU at all) and
// waits, before its Checkpoint, until the agent exports the CPU counter of
// its labels at 0 and (on the host) Prometheus has scraped it: the
// series' first sample is 0, so that increase() from before it has
// nothing to extrapolate at its start (checkCounter).
func zeroActivation(t *testing.T, c *churn, d *testenv.Statsd) {
	t.Helper()
	const key = "sandboxstats_workload_cpu_seconds_total{sandbox_class=gvisor,source=cgroup,template_name=py,template_namespace=tmpl}"
	cg := fmt.Sprintf("/churn-%d-zero", os.Getpid())
	testCgroup(t, cg)
	lc := lifecycleClient(t, d.Lifecycle)
	run(t, lc, "zero", &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		v, ok := testenv.Scrape(t, c.agentURL)[key]
		scraped := c.prom == nil
		if ok && v == 0 && c.prom != nil {
			q := c.prom.Query(t, `sandboxstats_workload_cpu_seconds_total{source="cgroup"}`)
			scraped = len(q) == 1 && q[0].Value == 0
		}
		if ok && v == 0 && scraped {
			break
		}
		if ok && v != 0 || time.Now().After(deadline) {
			t.Fatalf("the CPU counter of an empty cgroup's activation: %v (exported: %v), want 0 exported and scraped within 15 s", v, ok)
		}
	}
	checkpoint(t, lc, "zero")
	c.mu.Lock()
	c.truth["zero"] = cgroupCPUUsec(t, cg)
	c.mu.Unlock()
}

// killAt waits for the place how names, SIGKILLs the agent there, and says
// what the agent was doing (its sweeps, the events in its queue: a record
// stays queued until its export's outcome is known).
func killAt(a *agentLives, sink eventSink, how string, rng *rand.Rand) (string, error) {
	what, err := aimKill(a, sink, how, rng)
	if err == nil {
		err = a.kill(how)
	}
	if how == killMidExport {
		if rerr := sink.resume(); err == nil {
			err = rerr
		}
	}
	return what, err
}

// aimKill waits for the place how names and says what the agent was doing
// there. For a kill mid-export it pauses the sink: the next export hangs,
// sent and unanswered, until killAt resumes the sink after the kill.
func aimKill(a *agentLives, sink eventSink, how string, rng *rand.Rand) (string, error) {
	base := a.url()
	sweeps, _ := agentGauge(base, "sandboxstats_agent_sweeps_total")
	nextSweep := func() error {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if n, ok := agentGauge(base, "sandboxstats_agent_sweeps_total"); ok && n > sweeps {
				sweeps = n
				return nil
			}
		}
		return fmt.Errorf("no sweep completed within 10 s of sweep %v", sweeps)
	}
	// queued waits (up to within) until the queue holds events and returns
	// how many.
	queued := func(within time.Duration) float64 {
		for deadline := time.Now().Add(within); time.Now().Before(deadline); {
			if n, ok := agentGauge(base, "sandboxstats_agent_otlp_queue_records"); ok && n > 0 {
				return n
			}
			time.Sleep(time.Millisecond)
		}
		return 0
	}
	switch how {
	case killMidExport: // the sink paused: the next sweep's events are sent and hang unanswered
		if err := sink.pause(); err != nil {
			return "", err
		}
		n := queued(5 * time.Second)
		if n == 0 {
			return "", fmt.Errorf("no event queued within 5 s of the sink's pause")
		}
		time.Sleep(50 * time.Millisecond) // the export on the wire
		return fmt.Sprintf("%v events in an export left unanswered", n), nil
	case killBetween:
		if err := nextSweep(); err != nil {
			return "", err
		}
		time.Sleep(churnInterval/2 - 150*time.Millisecond + randUpTo(rng, 300*time.Millisecond))
	case killRandom:
		time.Sleep(randUpTo(rng, churnInterval))
	case killQueued:
		n := queued(10 * time.Second)
		if n == 0 {
			return "", fmt.Errorf("no event queued within 10 s with the sink down")
		}
		return fmt.Sprintf("%v events queued", n), nil
	}
	n, _ := agentGauge(base, "sandboxstats_agent_otlp_queue_records")
	return fmt.Sprintf("%v events queued, %v sweeps", n, sweeps), nil
}

// randUpTo draws a duration in [0, d).
func randUpTo(rng *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(d)))
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// gapRetention is statsd's --ended-retention in the eviction gap test: the
// agent stays down past it.
const gapRetention = 4 * time.Second

// gapAgent is one statsagent process of the eviction gap test, which
// SIGKILLs it (testenv.StartStatsagentProcess's cleanup fails a test whose
// agent did not exit cleanly on SIGTERM).
type gapAgent struct {
	cmd      *exec.Cmd
	url, log string
	done     chan error // cmd.Wait's result; closed after it
}

// startGapAgent runs binDir/statsagent with args, its output in logPath,
// and waits until it serves. The cleanup stops it with SIGTERM unless the
// test killed it, and fails the test if it does not exit cleanly.
func startGapAgent(t *testing.T, binDir, logPath string, args ...string) *gapAgent {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	a := &gapAgent{cmd: exec.Command(filepath.Join(binDir, "statsagent"), append(args, "--metrics-listen", "127.0.0.1:0")...),
		log: logPath, done: make(chan error, 1)}
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	err = a.cmd.Start()
	logf.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err, ok := <-a.done:
			if ok && err != nil {
				t.Errorf("statsagent exited with %v after SIGTERM", err)
			}
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			t.Errorf("statsagent did not stop within 10 s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logPath, b)
		}
	})
	re := regexp.MustCompile(`msg="statsagent serving" addr=(\S+)`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(logPath)
		if m := re.FindSubmatch(b); m != nil {
			a.url = "http://" + string(m[1])
			return a
		}
	}
	b, _ := os.ReadFile(logPath)
	t.Fatalf("statsagent did not start:\n%s", b)
	return nil
}

// kill SIGKILLs the agent and waits for it to be gone.
func (a *gapAgent) kill(t *testing.T) {
	t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	if err := <-a.done; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("statsagent after SIGKILL: %v", err)
	}
}

// gapActivation is one activation of the eviction gap test and the record
// its Checkpoint answered.
type gapActivation struct {
	actor  string
	daemon string // the statsd's name
	phase  string // "before" the kill, "evicted" while the agent was down, "held" just before the restart
	ended  *sandboxstatsv1.EndedActivation
}

// endActivation runs one short activation of actor in a fresh cgroup bound
// to the statsd at lifecycle (Run, a child burning 100 ms of CPU in it,
// Checkpoint) and returns the ended record.
func endActivation(t *testing.T, lc sandboxstatsv1.WorkloadLifecycleServiceClient, daemon, phase string, i int) gapActivation {
	t.Helper()
	actor := fmt.Sprintf("gap-%s-%s-%d", daemon, phase, i)
	cg := fmt.Sprintf("/%d-%s", os.Getpid(), actor)
	testCgroup(t, cg)
	w := testenv.StartChild(t, "TestWorkloadChild")
	defer w.Kill()
	run(t, lc, actor, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg})
	moveTo(t, cg, w.Cmd.Process.Pid)
	w.Do(t, "burn 100")
	e := checkpoint(t, lc, actor)
	t.Logf("%s: ended, sequence %d of instance %s, CPU %d us", actor, e.GetSequence(), e.GetInstanceId(), e.GetCpuUsec())
	return gapActivation{actor: actor, daemon: daemon, phase: phase, ended: e}
}

// endedLog asks the statsd at socket for its ended log
// (ListEndedActivations: it serves only the records held).
func endedLog(t *testing.T, socket string) *sandboxstatsv1.EndedLog {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := sandboxstatsv1.NewWorkloadStatsServiceClient(cc).ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
	if err != nil {
		t.Fatalf("ListEndedActivations %s: %v", socket, err)
	}
	return resp.GetEndedLog()
}

// gapDaemon is one statsd of the eviction gap test: how it evicts, and how
// many activations end on it in each phase.
type gapDaemon struct {
	name string
	args []string
	// before: end while the agent runs (their finals arrive); evicted:
	// end while it is down and are evicted before it restarts; held: end
	// while it is down, just before it restarts, and are still held.
	before, evicted, held int
}

// gapDaemons: "m" evicts by --ended-max 2 (its two held records push out
// the two that ended before them), "r" by --ended-retention (the agent
// stays down past it). In each phase m's activations end first, so that
// r's held records are the last to end before the restart: the furthest
// from their retention when the restarted agent reads them.
var gapDaemons = []gapDaemon{
	{name: "m", args: []string{"--ended-max", "2"}, before: 2, evicted: 2, held: 2},
	{name: "r", args: []string{"--ended-retention", gapRetention.String()}, before: 2, evicted: 3, held: 2},
}

// gapOutcome is what an eviction gap run saw.
type gapOutcome struct {
	acts      []gapActivation
	logs      map[string]*sandboxstatsv1.EndedLog // by statsd name, just before the restart
	lostTotal float64                             // the restarted agent's sandboxstats_agent_ended_records_lost_total
	lost      []testenv.CollectedLog              // the lost events (distinct by log.record.uid)
	lostSent  int                                 // lost events that arrived, copies included
	finals    map[string][]testenv.CollectedLog
	down      time.Duration // how long no agent ran
	stateFile []byte        // agent-state.json as the killed agent left it
	warnings  []string      // the restarted agent's log lines on records lost
}

// runEndedGap runs the eviction gap scenario on gapDaemons: the statsagent
// binary (with --state-dir when withState) pushing OTLP to a real
// Collector; the "before" activations end while it runs, then it is
// SIGKILLed; the "evicted" ones end while it is down and are evicted
// (statsd r's left past the retention), the "held" ones end just before it
// is started again (on the same state directory). Without withState it is
// the agent before --state-dir (for a run by hand: the restarted agent sees
// no gap, no lost event is sent, and no record that ended while it was
// down gets a final).
func runEndedGap(t *testing.T, withState bool) gapOutcome {
	t.Helper()
	needCgroups(t)
	if testenv.InVMLane() {
		t.Skip("the VM lane's guest has no collector: the host's run holds this test")
	}
	bin := testenv.BuildBinaries(t, "statsagent")
	dir := fleetDir(t)
	col := testenv.StartCollector(t, testenv.WithCollectorSocket(filepath.Join(t.TempDir(), "otlp.sock")))
	daemons := map[string]*testenv.Statsd{}
	lcs := map[string]sandboxstatsv1.WorkloadLifecycleServiceClient{}
	for _, g := range gapDaemons {
		daemons[g.name] = startStatsdIn(t, bin, dir, g.name, g.args...)
		lcs[g.name] = lifecycleClient(t, daemons[g.name].Lifecycle)
	}
	stateDir := filepath.Join(dir, "agent-state")
	args := []string{"--sockets", filepath.Join(dir, "stats", "*.sock"), "--interval", "500ms", "--min-interval", "100ms",
		"--timeout", "400ms", "--otlp-endpoint", "unix://" + col.Socket(), "--otlp-periodic-every", "0"}
	if withState {
		args = append(args, "--state-dir", stateDir)
	}
	out := gapOutcome{logs: map[string]*sandboxstatsv1.EndedLog{}}
	phase := func(name string, count func(gapDaemon) int) {
		for _, g := range gapDaemons {
			for i := range count(g) {
				out.acts = append(out.acts, endActivation(t, lcs[g.name], g.name, name, i))
			}
		}
	}

	agent := startGapAgent(t, bin, filepath.Join(dir, "statsagent-0.log"), args...)
	phase("before", func(g gapDaemon) int { return g.before })
	col.WaitLogs(t, 15*time.Second, func(l []testenv.CollectedLog) bool {
		finals, _ := finalsByActor(l)
		return len(finals) == len(out.acts)
	})
	testenv.WaitNewSweeps(t, agent.url) // a save after the finals were settled
	agent.kill(t)
	killed := time.Now()
	if withState {
		out.stateFile, _ = os.ReadFile(filepath.Join(stateDir, "agent-state.json"))
	}

	phase("evicted", func(g gapDaemon) int { return g.evicted })
	time.Sleep(gapRetention + 300*time.Millisecond)        // r's records past the retention
	phase("held", func(g gapDaemon) int { return g.held }) // m's push out its evicted ones
	for name, d := range daemons {
		out.logs[name] = endedLog(t, d.Stats)
	}
	agent = startGapAgent(t, bin, filepath.Join(dir, "statsagent-1.log"), args...)
	out.down = time.Since(killed)

	// What reached the Collector once every final the agent can send
	// arrived (or 15 s passed) and two more sweeps had their chance to emit
	// anything else.
	wantFinals := 0
	for _, a := range out.acts {
		if a.phase != "evicted" {
			wantFinals++
		}
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if finals, _ := finalsByActor(col.Logs(t)); len(finals) >= wantFinals {
			break
		}
	}
	out.lostTotal = testenv.WaitNewSweeps(t, agent.url)["sandboxstats_agent_ended_records_lost_total{}"]
	time.Sleep(500 * time.Millisecond) // an export in flight lands
	arrived := col.Logs(t)
	logs, _ := dedupeByUID(arrived)
	out.finals, _ = finalsByActor(logs)
	for _, l := range arrived {
		if l.Attributes["sandboxstats.stats.kind"] == "lost" {
			out.lostSent++
		}
	}
	for _, l := range logs {
		if l.Attributes["sandboxstats.stats.kind"] == "lost" {
			out.lost = append(out.lost, l)
		}
	}
	b, _ := os.ReadFile(agent.log)
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "dropped by statsd") {
			out.warnings = append(out.warnings, strings.TrimSpace(line))
		}
	}
	return out
}

// TestIntegrationEndedGapAcrossAgentDowntime is the eviction gap of issue 30
// on real cgroups with the real Collector: the agent (with --state-dir) is
// SIGKILLed and stays down longer than statsd r's --ended-retention (4 s):
// three activations that ended on r meanwhile are evicted before it
// restarts; on statsd m (--ended-max 2) two are pushed out by two later
// ones. Each statsd counts its evicted never served; the restarted agent
// counts them lost (sandboxstats_agent_ended_records_lost_total, 5) and
// emits exactly one lost event per statsd naming them (instance, from and
// to sequences), and sends the finals of the records still held: every
// activation is a final or inside its statsd's lost range, none silently
// absent.
func TestIntegrationEndedGapAcrossAgentDowntime(t *testing.T) {
	start := time.Now()
	out := runEndedGap(t, true)
	t.Logf("agent down %v (r's retention %v); agent-state.json the killed agent left:\n%s", out.down.Round(time.Millisecond), gapRetention, out.stateFile)
	var lostWant int
	for _, g := range gapDaemons {
		lostWant += g.evicted
	}
	t.Logf("restarted agent: %v ended records lost; %d lost events (%d arrivals); its log:\n%s", out.lostTotal, len(out.lost), out.lostSent, strings.Join(out.warnings, "\n"))
	if out.lostTotal != float64(lostWant) {
		t.Errorf("sandboxstats_agent_ended_records_lost_total %v, want %d", out.lostTotal, lostWant)
	}
	if len(out.warnings) != len(gapDaemons) {
		t.Errorf("the restarted agent logged %d gaps, want one per statsd", len(out.warnings))
	}
	if len(out.lost) != len(gapDaemons) {
		t.Errorf("%d lost events (distinct by log.record.uid), want one per statsd: %+v", len(out.lost), out.lost)
	}
	for _, g := range gapDaemons {
		t.Run(g.name, func(t *testing.T) { checkGap(t, g, out) })
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// checkGap checks one statsd's part of an eviction gap run: its ended log
// counts the evicted ones dropped never served; one lost event names them;
// every other activation has one final (its record's sequence and CPU).
func checkGap(t *testing.T, g gapDaemon, out gapOutcome) {
	l := out.logs[g.name]
	t.Logf("statsd %s's ended log just before the restart: instance %s, sequences %d to %d held, evicted %d by retention, %d by --ended-max, %d never served",
		g.name, l.GetInstanceId(), l.GetLowestSequence(), l.GetNextSequence()-1, l.GetEvictedRetention(), l.GetEvictedMax(), l.GetEvictedNeverServed())
	evicted := l.GetEvictedRetention() + l.GetEvictedMax() + l.GetEvictedSize()
	if l.GetEvictedNeverServed() != uint64(g.evicted) || evicted != uint64(g.before+g.evicted) || l.GetNextSequence()-l.GetLowestSequence() != uint64(g.held) {
		t.Errorf("statsd %s: %d evicted, %d never served, %d held; want %d (the ones that ended before the kill served), %d, %d",
			g.name, evicted, l.GetEvictedNeverServed(), l.GetNextSequence()-l.GetLowestSequence(), g.before+g.evicted, g.evicted, g.held)
	}

	var lost map[string]any
	for _, e := range out.lost {
		if strings.HasSuffix(fmt.Sprint(e.Attributes["sandboxstats.daemon.socket"]), "/"+g.name+".sock") {
			if lost != nil {
				t.Errorf("a second lost event: %v", e.Attributes)
			}
			lost = e.Attributes
		}
	}
	var seqs, evictedSeqs []uint64
	for _, a := range out.acts {
		if a.daemon == g.name {
			seqs = append(seqs, a.ended.GetSequence())
			if a.phase == "evicted" {
				evictedSeqs = append(evictedSeqs, a.ended.GetSequence())
			}
		}
	}
	if want := seqsFrom(1, g.before+g.evicted+g.held); !slices.Equal(seqs, want) {
		t.Errorf("the activations' sequences %v, want %v", seqs, want)
	}
	var from, to int64 = -1, -1
	if lost == nil {
		t.Error("no lost event")
	} else {
		t.Logf("its lost event: %v", lost)
		from, _ = lost["sandboxstats.ended.lost_from_sequence"].(int64)
		to, _ = lost["sandboxstats.ended.lost_to_sequence"].(int64)
		n, _ := lost["sandboxstats.ended.lost_records"].(int64)
		if n != int64(g.evicted) || from != int64(evictedSeqs[0]) || to != int64(evictedSeqs[len(evictedSeqs)-1]) || lost["sandboxstats.ended.instance_id"] != l.GetInstanceId() {
			t.Errorf("lost event: %d records, sequences %d to %d of instance %v; want %d, %d to %d (the evicted ones) of %s",
				n, from, to, lost["sandboxstats.ended.instance_id"], g.evicted, evictedSeqs[0], evictedSeqs[len(evictedSeqs)-1], l.GetInstanceId())
		}
	}
	for _, a := range out.acts {
		if a.daemon != g.name {
			continue
		}
		seq := a.ended.GetSequence()
		f := out.finals[a.actor]
		inLost := int64(seq) >= from && int64(seq) <= to
		switch {
		case a.phase == "evicted" && len(f) == 0 && inLost:
		case a.phase != "evicted" && len(f) == 1 && !inLost:
			fs, _ := f[0].Attributes["sandboxstats.ended.sequence"].(int64)
			cpu, _ := f[0].Attributes["sandboxstats.stats.cpu.time"].(float64)
			if fs != int64(seq) || cpu != float64(a.ended.GetCpuUsec())/1e6 {
				t.Errorf("%s: final of sequence %d, CPU %v s; its record: sequence %d, CPU %d us", a.actor, fs, cpu, seq, a.ended.GetCpuUsec())
			}
		default:
			t.Errorf("%s (sequence %d): %d finals, inside the lost range %d to %d: %v", a.actor, seq, len(f), from, to, inLost)
		}
	}
}

// seqsFrom returns n sequences from first.
func seqsFrom(first uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out
}

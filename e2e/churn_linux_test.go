package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// churnInterval is the agent's poll interval in the churn tests; activation
// lifetimes are multiples of it.
const churnInterval = time.Second

// churn is the node of a churn test: statsd daemons, the statsagent binary
// polling them, its activation log, a real Prometheus scraping it, and an
// in-process poller applying the rules before activation accounting (for
// the comparison).
type churn struct {
	bin, dir, agentURL, actLog string
	prom                       *testenv.Prometheus
	legacy                     *legacyPoller

	mu    sync.Mutex
	truth map[string]uint64 // actor -> the cgroup's own CPU at the end, usec
}

// startChurn starts the node: the agent with agentArgs added.
func startChurn(t *testing.T, agentArgs ...string) *churn {
	t.Helper()
	c := &churn{bin: testenv.BuildBinaries(t, "statsagent"), dir: fleetDir(t), truth: map[string]uint64{}}
	c.actLog = filepath.Join(c.dir, "activations.jsonl")
	glob := filepath.Join(c.dir, "stats", "*.sock")
	c.agentURL = testenv.StartStatsagent(t, c.bin, c.dir, append([]string{"--sockets", glob, "--interval", churnInterval.String(),
		"--min-interval", "100ms", "--timeout", "5s", "--grace", "2m", "--activation-log", c.actLog}, agentArgs...)...)
	if !testenv.InVMLane() { // the VM lane's guest has no Prometheus: the host's run holds those assertions
		u, _ := url.Parse(c.agentURL)
		c.prom = testenv.StartPrometheus(t, []string{u.Host}, 500*time.Millisecond)
	}
	c.legacy = startLegacyPoller(t, glob, churnInterval)
	return c
}

// placement is where an activation falls against the agent's sweeps.
type placement int

const (
	// anytime: wherever its lifetime puts it.
	anytime placement = iota
	// betweenSweeps: it starts right after a sweep completed and takes less
	// than an interval, so that no sweep sees it alive.
	betweenSweeps
	// restartAfter: its Checkpoint is sent right after a sweep completed and
	// its statsd is restarted as soon as the Checkpoint answered, so that the
	// next sweep starts after the old statsd stopped: the record reaches the
	// agent only from the restarted statsd.
	restartAfter
)

// nextSweep waits for the agent to complete a sweep and returns the count of
// sweeps completed then.
func (c *churn) nextSweep(t *testing.T) float64 {
	t.Helper()
	n := testenv.Scrape(t, c.agentURL)["sandboxstats_agent_sweeps_total{}"]
	sweeps := n
	for ; sweeps == n; sweeps = testenv.Scrape(t, c.agentURL)["sandboxstats_agent_sweeps_total{}"] {
		time.Sleep(10 * time.Millisecond)
	}
	return sweeps
}

// activation runs one activation of actor in a fresh cgroup bound to d:
// Run, a workload child burning CPU for most of lifetime, then the ground
// truth (the cgroup's own cpuacct.usage or cpu.stat usage_usec, the
// workload idle), Checkpoint,
// and the child killed. With betweenSweeps or restartAfter it reports
// whether the placement held, from the agent's own sweep times (a sweep's
// start is its end less its duration): betweenSweeps, that the next sweep
// started after the Checkpoint answered; restartAfter, that no sweep
// completed between the sweep before the Checkpoint and the old statsd's
// stop, the next one starting after that stop. On a loaded runner it may
// not hold, and the caller tries again.
func (c *churn) activation(t *testing.T, d *testenv.Statsd, actor string, lifetime time.Duration, place placement) (held bool) {
	t.Helper()
	cg := fmt.Sprintf("/churn-%d-%s", os.Getpid(), actor)
	testCgroup(t, cg)
	w := testenv.StartChild(t, "TestWorkloadChild")
	var sweeps float64
	if place == betweenSweeps {
		sweeps = c.nextSweep(t)
	}
	lc := lifecycleClient(t, d.Lifecycle)
	start := time.Now()
	run(t, lc, actor, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg})
	moveTo(t, cg, w.Cmd.Process.Pid)
	w.Do(t, fmt.Sprintf("burn %d", lifetime.Milliseconds()/2))
	if rest := lifetime - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
	if place == restartAfter {
		sweeps = c.nextSweep(t) // the workload idle: its truth does not move while it waits
	}
	truth := cgroupCPUUsec(t, cg)
	e := checkpoint(t, lc, actor)
	lived := time.Since(start)
	var stopped time.Time
	if place == restartAfter {
		d.Stop(t)
		stopped = time.Now()
		d.Restart(t) // its Stop a no-op now: statsd started again on the same sockets and state
	}
	w.Kill()
	c.mu.Lock()
	c.truth[actor] = truth
	c.mu.Unlock()
	t.Logf("%s: lived %v (%.2f intervals), cgroup CPU %d us, record %d us (%s)", actor, lived.Round(time.Millisecond),
		float64(lived)/float64(churnInterval), truth, e.GetCpuUsec(), e.GetFinalProvenance())
	if place == anytime {
		return false
	}
	answered := start.Add(lived)
	m := testenv.WaitSweeps(t, c.agentURL, sweeps+1)
	next := time.Unix(0, int64((m["sandboxstats_agent_last_sweep_timestamp_seconds{}"]-m["sandboxstats_agent_last_sweep_duration_seconds{}"])*1e9))
	if place == betweenSweeps {
		held = m["sandboxstats_agent_sweeps_total{}"] == sweeps+1 && next.After(answered)
		t.Logf("%s: the next sweep started %v after the Checkpoint answered (unseen by a sweep: %v)", actor, next.Sub(answered).Round(time.Millisecond), held)
		return held
	}
	held = m["sandboxstats_agent_sweeps_total{}"] == sweeps+1 && next.After(stopped)
	t.Logf("%s: statsd stopped %v after the Checkpoint answered; the first sweep to complete after the Checkpoint is %v on from the one before it (want 1) and started %v after the stop (no sweep between the Checkpoint and the restart: %v)",
		actor, stopped.Sub(answered).Round(time.Millisecond), m["sandboxstats_agent_sweeps_total{}"]-sweeps, next.Sub(stopped).Round(time.Millisecond), held)
	return held
}

// lifecycleClient dials a statsd lifecycle socket (in-process, so that an
// activation's lifetime is not an exec's).
func lifecycleClient(t *testing.T, socket string) sandboxstatsv1.WorkloadLifecycleServiceClient {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc)
}

func run(t *testing.T, lc sandboxstatsv1.WorkloadLifecycleServiceClient, actor string, ref *sandboxstatsv1.SandboxRef) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Sandbox: ref, Identity: &sandboxstatsv1.WorkloadIdentity{
		ActorUid: actor, TemplateNamespace: "tmpl", TemplateName: "py"}}); err != nil {
		t.Fatalf("RunWorkload %s: %v", actor, err)
	}
}

func checkpoint(t *testing.T, lc sandboxstatsv1.WorkloadLifecycleServiceClient, actor string) *sandboxstatsv1.EndedActivation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: actor})
	if err != nil {
		t.Fatalf("CheckpointWorkload %s: %v", actor, err)
	}
	return resp.GetEnded()
}

// cgroupCPUUsec reads the cgroup's own CPU counter, in usec: v1
// cpuacct.usage (ns), v2 cpu.stat usage_usec.
func cgroupCPUUsec(t *testing.T, rel string) uint64 {
	t.Helper()
	if testenv.CgroupV2() {
		return testenv.CgroupUint(t, filepath.Join("/sys/fs/cgroup", rel), "cpu.stat", "usage_usec")
	}
	return testenv.CgroupUint(t, filepath.Join("/sys/fs/cgroup/cpuacct", rel), "cpuacct.usage", "") / 1000
}

func (c *churn) truthSum() (sum float64, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.truth {
		sum += float64(v) / 1e6
	}
	return sum, len(c.truth)
}

// actors returns the activations' actors, sorted.
func (c *churn) actors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.truth))
}

// records reads the activation log, by actor (each actor has one
// activation).
func (c *churn) records(t *testing.T) map[string]nodeagent.ActivationRecord {
	t.Helper()
	out := map[string]nodeagent.ActivationRecord{}
	for _, r := range c.recordList(t) {
		if _, dup := out[r.ActorUID]; dup {
			t.Errorf("activation of %s logged twice", r.ActorUID)
		}
		out[r.ActorUID] = r
	}
	return out
}

// recordList reads the activation log, in its order.
func (c *churn) recordList(t *testing.T) []nodeagent.ActivationRecord {
	t.Helper()
	f, err := os.Open(c.actLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []nodeagent.ActivationRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r nodeagent.ActivationRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("activation log line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestIntegrationActivationChurnCgroup is the churn of the activation
// accounting issue on real cgroups (v1 on the host, v2 in the VM lane): three long-lived statsd, twelve
// activations with lifetimes from 0.25 to 4 poll intervals burning real CPU
// (one starting and ending between two sweeps, one whose statsd restarts
// right after its Checkpoint, before any sweep could poll the record from
// the old statsd), polled by the statsagent binary and scraped
// by a real Prometheus. The CPU-seconds the agent exports, and the _sum of
// its activation CPU histogram (in the agent and in Prometheus), equal the
// cgroups' own counters at each activation's end within 1%; every
// activation has exactly one record.
func TestIntegrationActivationChurnCgroup(t *testing.T) {
	needCgroups(t)
	c := startChurn(t)
	var daemons []*testenv.Statsd
	for _, name := range []string{"a", "b", "c"} {
		daemons = append(daemons, startStatsdIn(t, c.bin, c.dir, name))
	}
	type act struct {
		intervals float64
		place     placement
	}
	lanes := [][]act{
		{{intervals: 0.25, place: betweenSweeps}, {intervals: 1}, {intervals: 4}, {intervals: 0.5}},
		{{intervals: 2}, {intervals: 0.3}, {intervals: 1.5}, {intervals: 3}},
		// The restarted one lives 1 to 2 intervals: it waits for a sweep
		// before its Checkpoint.
		{{intervals: 0.75}, {intervals: 2.5}, {intervals: 0.25}, {intervals: 1, place: restartAfter}},
	}
	// The tries of the between-sweeps activation that no sweep saw, and of
	// the restarted statsd's activation whose record no sweep took from the
	// old statsd.
	var betweenActor, restartActor atomic.Value
	t.Run("lanes", func(t *testing.T) {
		for i, lane := range lanes {
			d := daemons[i]
			t.Run(fmt.Sprint("statsd-", i), func(t *testing.T) {
				t.Parallel()
				for j, a := range lane {
					actor := fmt.Sprintf("churn-%d-%d", i, j)
					lifetime := time.Duration(a.intervals * float64(churnInterval))
					if a.place == anytime {
						c.activation(t, d, actor, lifetime, anytime)
						continue
					}
					held := &betweenActor
					if a.place == restartAfter {
						held = &restartActor
					}
					for try := range 3 { // up to three tries for one where the placement held
						name := fmt.Sprintf("%s-try%d", actor, try)
						if c.activation(t, d, name, lifetime, a.place) {
							held.Store(name)
							break
						}
					}
				}
			})
		}
	})
	if t.Failed() {
		return
	}
	testenv.WaitNewSweeps(t, c.agentURL)      // the last ends seen ...
	m := testenv.WaitNewSweeps(t, c.agentURL) // ... and charged
	truth, n := c.truthSum()
	var exported, hist float64
	for k, v := range m {
		switch {
		case strings.HasPrefix(k, "sandboxstats_workload_cpu_seconds_total{") && strings.Contains(k, "source=cgroup"):
			exported += v
		case strings.HasPrefix(k, "sandboxstats_activation_cpu_seconds_sum{") && strings.Contains(k, "source=cgroup"):
			hist += v
		}
	}
	legacy := c.legacy.total()
	t.Logf("%d activations: cgroups used %.3f CPU-s; statsagent exported %.3f (%.4f of it), activation histogram _sum %.3f (%.4f); today's rules (before activation accounting) %.3f (%.3f)",
		n, truth, exported, exported/truth, hist, hist/truth, legacy, legacy/truth)
	if !within(exported, truth, 0.01) {
		t.Errorf("exported CPU %.3f s, cgroups' own %.3f s: off by more than 1%%", exported, truth)
	}
	if !within(hist, truth, 0.01) {
		t.Errorf("activation CPU histogram _sum %.3f s, cgroups' own %.3f s: off by more than 1%%", hist, truth)
	}

	recs := c.records(t)
	for actor := range c.truth {
		r, ok := recs[actor]
		switch {
		case !ok:
			t.Errorf("no activation record for %s", actor)
		case r.FinalProvenance != "read-at-end" || r.CPUSeconds == nil:
			t.Errorf("record of %s: %+v", actor, r)
		}
	}
	if name, ok := betweenActor.Load().(string); !ok {
		t.Error("in three tries, a sweep saw the between-sweeps activation alive each time (a runner too loaded for a 250 ms activation within a 1 s interval)")
	} else if recs[name].Charge != "whole" {
		t.Errorf("the activation %s between two sweeps was charged %q, want whole", name, recs[name].Charge)
	}
	if name, ok := restartActor.Load().(string); !ok {
		t.Error("in three tries, a sweep completed between the Checkpoint and the statsd restart each time (a runner too loaded to restart statsd within a 1 s interval)")
	} else if r := recs[name]; r.ActorUID == "" || r.Charge != "tail" {
		t.Errorf("the activation %s whose record reached the agent only from the restarted statsd: record %+v, want its tail charged", name, r)
	}

	// The same figures through a real Prometheus.
	if c.prom == nil {
		t.Log("no Prometheus in the VM lane's guest: the host's run of this test checks it")
		return
	}
	time.Sleep(1500 * time.Millisecond) // at least two scrapes after the agent's last sweep
	q := c.prom.Query(t, `sum(sandboxstats_activation_cpu_seconds_sum{source="cgroup"})`)
	qc := c.prom.Query(t, `sum(sandboxstats_workload_cpu_seconds_total{source="cgroup"})`)
	if len(q) != 1 || len(qc) != 1 {
		t.Fatalf("prometheus answered %v and %v", q, qc)
	}
	t.Logf("prometheus: activation CPU _sum %.3f (%.4f of the truth), CPU counter %.3f", q[0].Value, q[0].Value/truth, qc[0].Value)
	if !within(q[0].Value, truth, 0.01) || !within(qc[0].Value, truth, 0.01) {
		t.Errorf("prometheus: _sum %.3f, counter %.3f; cgroups' own %.3f s", q[0].Value, qc[0].Value, truth)
	}
	if out := testenv.PromtoolCheckMetrics(t, metricsText(t, c.agentURL)); out != "" {
		t.Errorf("promtool check metrics:\n%s", out)
	}
}

// TestIntegrationActivationFinalReadHangs: a micro-VM whose guest agent hangs
// at its Checkpoint still gets a record (the last good poll, with its age
// and the reason), the Checkpoint costs at most the read timeout plus a
// little, and the agent charges the activation's CPU up to that poll.
func TestIntegrationActivationFinalReadHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs statsd, statsagent and Prometheus; not under -short")
	}
	c := startChurn(t)
	d := startStatsdIn(t, c.bin, c.dir, "vm")
	guest := kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 10_000_000_000} // 10 s of an earlier life
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(guest)))
	statsctl(t, c.bin, "restore-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "vm-1",
		"--template-namespace", "tmpl", "--template-name", "py", "--class", "microvm", "--agent-address", agent.Address(), "--container-id", "web")
	testenv.WaitNewSweeps(t, c.agentURL)
	guest.CPUTotal += 700_000_000
	agent.SetContainer("web", kataagentfake.V2(guest))
	testenv.WaitNewSweeps(t, c.agentURL)
	agent.SetStatsHang(true)
	start := time.Now()
	out := statsctl(t, c.bin, "checkpoint-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "vm-1")
	took := time.Since(start)
	agent.SetStatsHang(false)
	t.Logf("checkpoint with a hung agent took %v:\n%s", took.Round(time.Millisecond), out)
	if took > 2*time.Second+1500*time.Millisecond {
		t.Errorf("Checkpoint took %v with a 2 s read timeout", took)
	}
	// What the launcher is told: the final is the last good poll, its age
	// (the final read hung the read timeout after it), and why.
	final := regexp.MustCompile(`(?m)^FINAL\s+last good poll (\S+) before the end \((.+)\)$`).FindStringSubmatch(string(out))
	if final == nil {
		t.Fatalf("checkpoint-workload does not say the final is the last good poll:\n%s", out)
	}
	age, err := time.ParseDuration(final[1])
	if err != nil {
		t.Fatalf("final age %q: %v", final[1], err)
	}
	if age < 2*time.Second || age > took+churnInterval+time.Second {
		t.Errorf("final age %v, want at least the 2 s read timeout and at most the Checkpoint's %v plus an interval and 1 s", age, took.Round(time.Millisecond))
	}
	if !strings.Contains(final[2], "deadline exceeded") && !strings.Contains(final[2], "timed out") {
		t.Errorf("final reason %q does not say the read timed out", final[2])
	}
	m := testenv.WaitNewSweeps(t, c.agentURL)
	r, ok := c.records(t)["vm-1"]
	if !ok || r.FinalProvenance != "last-good-poll" || r.FinalReason == "" || r.CPUSeconds == nil || *r.CPUSeconds != 0.7 {
		t.Fatalf("record %+v, want last-good-poll with 0.7 s of CPU (the earlier life's 10 s not charged)", r)
	}
	if logged := time.Duration(r.FinalAgeSeconds * 1e9); (logged-age).Abs() > time.Millisecond || strings.ReplaceAll(r.FinalReason, "\n", " ") != final[2] {
		t.Errorf("activation log: final %v old (%q); statsctl said %v (%q)", logged, r.FinalReason, age, final[2])
	}
	if got := m["sandboxstats_workload_cpu_seconds_total{sandbox_class=microvm,source=guest-agent,template_name=py,template_namespace=tmpl}"]; got != 0.7 {
		t.Errorf("agent charged %.6f s to the guest, want exactly 0.7 (final minus baseline)", got)
	}
}

// TestIntegrationActivationMicroVMRestores: a guest whose CPU counter survives
// every restore (the Kata agent's lives in guest memory) is restored twice
// and checkpointed: each activation's CPU is its final minus its own
// baseline exactly, and the agent never charges the guest's earlier lives.
func TestIntegrationActivationMicroVMRestores(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs statsd, statsagent and Prometheus; not under -short")
	}
	c := startChurn(t)
	d := startStatsdIn(t, c.bin, c.dir, "vm")
	guest := kataagentfake.Container{UsageBytes: 64 << 20, CPUTotal: 42_000_000_000} // 42 s before this node saw it
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(guest)))
	lc := lifecycleClient(t, d.Lifecycle)
	restore := func(actorName string) *sandboxstatsv1.EndedActivation {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := lc.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{
			Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "vm-r", ActorName: actorName, TemplateNamespace: "tmpl", TemplateName: "py"},
			Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
				AgentAddress: agent.Address(), ContainerIds: []string{"web"}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetReplaced()
	}
	burn := func(usec uint64) {
		guest.CPUTotal += usec * 1000
		agent.SetContainer("web", kataagentfake.V2(guest))
		testenv.WaitNewSweeps(t, c.agentURL)
	}
	restore("first")
	testenv.WaitNewSweeps(t, c.agentURL)
	burn(300_000)
	burn(200_000)
	first := restore("second") // the same actor, another identity: a new activation, the first replaced
	if first.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED || first.GetCpuUsec() != 500_000 {
		t.Fatalf("first activation: %v", first)
	}
	testenv.WaitNewSweeps(t, c.agentURL) // the baseline is taken at the Restore: burn after it
	burn(1_250_000)
	second := checkpoint(t, lc, "vm-r")
	if second.GetCpuUsec() != 1_250_000 || second.GetFinalProvenance() != sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END {
		t.Fatalf("second activation: %v", second)
	}
	testenv.WaitNewSweeps(t, c.agentURL)
	m := testenv.WaitNewSweeps(t, c.agentURL)
	got := m["sandboxstats_workload_cpu_seconds_total{sandbox_class=microvm,source=guest-agent,template_name=py,template_namespace=tmpl}"]
	t.Logf("guest counter 42 s before, then 0.5 s and 1.25 s in two activations: agent charged %.6f s", got)
	if got != 1.75 {
		t.Errorf("agent charged %.6f s, want exactly 1.75 (the two activations, not the guest's earlier 42 s)", got)
	}
}

// TestIntegrationActivationChurnGVisor: three real gVisor sandboxes (runsc,
// ptrace), each bound by its sentry pid, burning CPU inside, checkpointed
// and deleted in turn: the CPU the agent exports equals the sandbox cgroups'
// own counters at each end within 2%.
func TestIntegrationActivationChurnGVisor(t *testing.T) {
	needCgroups(t)
	testenv.NeedRunsc(t)
	c := startChurn(t)
	d := startStatsdIn(t, c.bin, c.dir, "gv")
	lc := lifecycleClient(t, d.Lifecycle)
	for i, loops := range []int{60_000, 150_000, 100_000} {
		actor := fmt.Sprint("gvisor-", i)
		sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
		start := time.Now()
		run(t, lc, actor, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, SentryPid: int32(sb.PID)})
		sb.Exec(t, "/bin/sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do i=$((i+1)); done", loops))
		if i == 1 {
			testenv.WaitNewSweeps(t, c.agentURL) // one lives across sweeps; the others may not
		}
		truth := cgroupCPUUsec(t, sb.CgroupPath)
		e := checkpoint(t, lc, actor)
		sb.Delete(t)
		c.mu.Lock()
		c.truth[actor] = truth
		c.mu.Unlock()
		t.Logf("%s: lived %v, sandbox cgroup CPU %d us, record %d us (%s)", actor, time.Since(start).Round(time.Millisecond), truth, e.GetCpuUsec(), e.GetFinalProvenance())
	}
	testenv.WaitNewSweeps(t, c.agentURL)      // the last ends seen ...
	m := testenv.WaitNewSweeps(t, c.agentURL) // ... and charged
	truth, n := c.truthSum()
	exported := m["sandboxstats_workload_cpu_seconds_total{sandbox_class=gvisor,source=cgroup,template_name=py,template_namespace=tmpl}"]
	hist := m["sandboxstats_activation_cpu_seconds_sum{sandbox_class=gvisor,source=cgroup,template_name=py,template_namespace=tmpl}"]
	t.Logf("%d gVisor activations: sandbox cgroups used %.3f CPU-s; statsagent exported %.3f (%.4f), histogram _sum %.3f (%.4f); today's rules %.3f (%.3f)",
		n, truth, exported, exported/truth, hist, hist/truth, c.legacy.total(), c.legacy.total()/truth)
	if !within(exported, truth, 0.02) || !within(hist, truth, 0.02) {
		t.Errorf("exported %.3f s and histogram %.3f s, the sandboxes' own %.3f s: off by more than 2%%", exported, hist, truth)
	}
	if recs := c.records(t); len(recs) != n {
		t.Errorf("%d activation records for %d activations", len(recs), n)
	}
}

func metricsText(t *testing.T, base string) []byte {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// legacyPoller sweeps like statsagent and charges CPU by the rules before
// activation accounting (the head and tail of every activation lost): first
// sight of a workload charges nothing, growth within an epoch is charged,
// a new cgroup epoch is charged in full if plausible, ended records are
// ignored. It gives the "today's rules" figure on the same churn.
type legacyPoller struct {
	mu    sync.Mutex
	usec  uint64
	last  map[string]*sandboxstatsv1.WorkloadStatsSample
	start time.Time
}

func startLegacyPoller(t *testing.T, glob string, interval time.Duration) *legacyPoller {
	l := &legacyPoller{last: map[string]*sandboxstatsv1.WorkloadStatsSample{}, start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			res, _ := sweep.Sweep(ctx, glob, 8, 5*time.Second)
			l.apply(res)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func (l *legacyPoller) apply(res []sweep.DaemonResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range res {
		for _, s := range r.Samples {
			if s.CpuUsageUsec == nil {
				continue
			}
			prev := l.last[s.GetActorUid()]
			l.last[s.GetActorUid()] = s
			switch {
			case prev == nil:
			case prev.GetEpochUnixNano() != s.GetEpochUnixNano():
				if window := s.GetObservedAtUnixNano() - s.GetEpochUnixNano(); window > 0 && s.GetCpuUsageUsec()/2 <= uint64(window)/1000 {
					l.usec += s.GetCpuUsageUsec()
				}
			case s.GetCpuUsageUsec() >= prev.GetCpuUsageUsec():
				l.usec += s.GetCpuUsageUsec() - prev.GetCpuUsageUsec()
			default:
				l.usec += s.GetCpuUsageUsec()
			}
		}
	}
}

func (l *legacyPoller) total() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(l.usec) / 1e6
}

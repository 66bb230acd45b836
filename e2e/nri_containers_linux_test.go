package e2e

// The NRI bridge keeping a pod's container set (issue 31's "Under
// containerd with NRI"): a real containerd with NRI, the statsnri binary,
// real statsd with --runsc-root, containers made with crictl.

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// nriCtr is a container a test made in a pod with crictl.
type nriCtr struct{ name, id string }

// addContainer creates and starts a container named name in pod p.
func (r *nriRig) addContainer(t *testing.T, p *nriPod, name string, cmd ...string) nriCtr {
	t.Helper()
	id := r.c.CreateContainer(t, p.id, testenv.ContainerSpec{Name: name, Command: cmd})
	r.c.StartContainer(t, id)
	return nriCtr{name: name, id: id}
}

// containerSample is a container of statsctl stats -o json.
type containerSample struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	CPU    string `json:"cpu_usage_usec"`
	Exited bool   `json:"exited"`
}

// statsContainers reads pod p's sample with statsctl stats -o json.
func (r *nriRig) statsContainers(t *testing.T, p *nriPod) (epoch string, cs []containerSample, raw []byte) {
	t.Helper()
	out := statsctl(t, r.bin, "stats", "--socket", r.shards[p.shard].Stats, "--actor-uid", p.uid, "-o", "json")
	var w struct {
		Epoch      string            `json:"epoch_unix_nano"`
		Containers []containerSample `json:"containers"`
	}
	if err := json.Unmarshal(out, &w); err != nil {
		t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
	}
	return w.Epoch, w.Containers, out
}

// bridgeSent waits up to d for the bridge to have sent pod p's set as
// want ("name=id", in order): its log's last "updated a pod's
// containers" for the pod.
func (r *nriRig) bridgeSent(t *testing.T, d time.Duration, p *nriPod, want ...nriCtr) {
	t.Helper()
	var parts []string
	for _, c := range want {
		parts = append(parts, c.name+"="+c.id)
	}
	line := `containers="` + strings.Join(parts, " ") + `"` // slog's text quotes a value holding '='
	deadline := time.Now().Add(d)
	for {
		last, log := "", r.bridge.logTail(1<<20)
		if strings.Contains(log, "does not implement UpdateWorkloadContainers") {
			t.Fatalf("statsd answered UpdateWorkloadContainers UNIMPLEMENTED: it does not keep the set the bridge sends\nstatsnri log:\n%s", r.bridge.logTail(6000))
		}
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "updated a pod's containers") && strings.Contains(l, "uid="+p.uid) {
				last = l
			}
		}
		if strings.Contains(last, line) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge did not send pod %s's set %s within %v; last: %q\nstatsnri log:\n%s", p.name, line, d, last, r.bridge.logTail(6000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationNRIContainerSet: a runsc pod (crictl runp --runtime runsc)
// bound by the bridge; two containers made with crictl create/start
// (runsc joins them to the sandbox: their state files in the runsc root
// with the CRI annotations) are sent by the bridge with their names
// (UpdateWorkloadContainers), statsctl stats and statsagent's /metrics
// show them by name; a third added while the pod runs changes the set,
// not the activation (the same epoch, no ended record); one stopped and
// removed is dropped from the set at its stop and shown exited, the
// activation still the same. statsd answering UNIMPLEMENTED fails the
// test.
func TestIntegrationNRIContainerSet(t *testing.T) {
	began := time.Now()
	r := startNRIRigFor(t, func(c *testenv.Containerd) []string { return []string{"--runsc-root", c.RunscRoot} })
	r.bridge.start(t)
	r.bridge.waitHealthy(t, 10*time.Second)
	agent := testenv.StartStatsagent(t, r.bin, r.dir, "--sockets", r.dir+"/stats/*.sock", "--interval", "500ms", "--min-interval", "100ms", "--timeout", "5s")

	// The runsc pod, bound at its start with no container yet.
	p := r.runPod(t, "ctrs", "runsc", -1, "")
	r.waitBound(t, 10*time.Second, p)
	busy := r.addContainer(t, p, "busy", "/bin/sh", "-c", "while :; do :; done")
	idle := r.addContainer(t, p, "idle")
	files, err := r.c.RunscStateFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []nriCtr{busy, idle} {
		if !slices.Contains(files, c.id+"_sandbox:"+p.id+".state") {
			t.Errorf("no runsc state file of %s (%s) in %s: %v", c.name, c.id, r.c.RunscRoot, files)
		}
	}
	r.bridgeSent(t, 10*time.Second, p, busy, idle)
	unimpl := func() float64 {
		n := 0.0
		for k, v := range r.bridge.metrics(t) {
			if strings.HasPrefix(k, "sandboxstats_nri_statsd_calls_total{") && strings.Contains(k, "call=update-containers") && strings.Contains(k, "result=Unimplemented") {
				n += v
			}
		}
		return n
	}
	if n := unimpl(); n > 0 {
		t.Fatalf("statsd answered UpdateWorkloadContainers UNIMPLEMENTED %v times: the set is not statsd's", n)
	}
	epochOf := func() int64 {
		b := r.bindings(t)[p.uid]
		if len(b) != 1 {
			t.Fatalf("pod %s bound %d times: %+v", p.uid, len(b), b)
		}
		return b[0].epoch
	}
	epoch := epochOf()

	// waitStats waits up to 15s for statsctl stats to show containers ok.
	waitStats := func(what string, ok func([]containerSample) bool) []containerSample {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			_, cs, raw := r.statsContainers(t, p)
			if ok(cs) {
				return cs
			}
			if time.Now().After(deadline) {
				t.Fatalf("statsctl stats: %s not within 15s:\n%s", what, raw)
			}
		}
	}
	// sameActivation holds the pod to the epoch bound first, no ended record.
	sameActivation := func(after string) {
		t.Helper()
		if e := epochOf(); e != epoch {
			t.Errorf("epoch %d after %s, %d before: a new activation", e, after, epoch)
		}
		if e := r.ended(t)[p.uid]; len(e) > 0 {
			t.Errorf("pod %s has ended records after %s: %v", p.uid, after, e)
		}
		if n := unimpl(); n > 0 {
			t.Errorf("statsd answered UpdateWorkloadContainers UNIMPLEMENTED %v times", n)
		}
	}

	// statsctl stats shows both by name, busy burning.
	cs := waitStats("busy and idle", func(cs []containerSample) bool {
		return len(cs) == 2 && cs[0].Name == "busy" && cs[0].CPU != "" && cs[0].CPU != "0"
	})
	if cs[0].ID != busy.id || cs[1].Name != "idle" || cs[1].ID != idle.id {
		t.Errorf("statsctl stats containers %+v, want busy %s, idle %s", cs, busy.id, idle.id)
	}
	t.Logf("statsctl stats: %+v", cs)
	human := string(statsctl(t, r.bin, "stats", "--socket", r.shards[p.shard].Stats, "--actor-uid", p.uid))
	if !strings.Contains(human, "busy") || !strings.Contains(human, "idle") {
		t.Errorf("statsctl stats' table does not name busy and idle:\n%s", human)
	}

	// statsagent's /metrics, by container name.
	series := func(name string) (float64, bool) {
		for k, v := range testenv.Scrape(t, agent) {
			if strings.HasPrefix(k, "sandboxstats_container_cpu_seconds_total{") && strings.Contains(k, "container="+name+",") || strings.HasSuffix(k, "container="+name+"}") {
				return v, true
			}
		}
		return 0, false
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		b, okB := series("busy")
		_, okI := series("idle")
		if okB && okI && b > 0 {
			t.Logf("statsagent: sandboxstats_container_cpu_seconds_total busy %.3f s", b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsagent's /metrics has no busy and idle container series within 10s")
		}
	}

	// A third container while the pod runs: the set changes, not the
	// activation.
	third := r.addContainer(t, p, "third")
	r.bridgeSent(t, 10*time.Second, p, busy, idle, third)
	waitStats("the third container", func(cs []containerSample) bool { return len(cs) == 3 && cs[2].Name == "third" })
	sameActivation("the third container")

	// idle stopped and removed while the pod runs: dropped at its stop,
	// kept by statsd as exited; the activation stays.
	r.c.StopContainer(t, idle.id, time.Second)
	r.bridgeSent(t, 10*time.Second, p, busy, third)
	r.c.RemoveContainer(t, idle.id)
	cs = waitStats("idle exited", func(cs []containerSample) bool {
		i := slices.IndexFunc(cs, func(c containerSample) bool { return c.Name == "idle" })
		return i >= 0 && cs[i].Exited
	})
	t.Logf("after idle's stop: %+v", cs)
	sameActivation("idle's stop")

	// The runsc pod ends under its runtime (the runc shim cannot stop it).
	r.c.KillRunscPod(t, p.id)
	t.Logf("took %v", time.Since(began).Round(100*time.Millisecond))

}

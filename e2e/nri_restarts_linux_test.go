package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
)

// TestIntegrationNRIRestarts: the bridge SIGKILLed while pods come and go
// (one made, one stopped and removed, one stopped only) and started again;
// then containerd restarted, and pods coming and going after it (one made,
// one that predates the restart stopped and removed: NRI tells no plugin of
// that pod's stop, containerd#8426). Afterwards every running pod is bound
// exactly once over the two statsd, in the activation it began with (its
// epoch unchanged: nothing bound twice), and every ended pod has exactly one
// ended record, nothing replaced.
func TestIntegrationNRIRestarts(t *testing.T) {
	const resync = 2 * time.Second
	r := startNRIRig(t, "--resync", resync.String())
	r.bridge.start(t)
	r.bridge.waitHealthy(t, 10*time.Second)
	a := r.runPod(t, "a", "", 0, "")
	b := r.runPod(t, "b", "", 1, "")
	g := r.runPod(t, "g", "runsc", -1, "")
	r.waitBound(t, 2*time.Second, a, b, g)
	epochs := map[string]int64{}
	record := func(pods ...*nriPod) {
		bs := r.bindings(t)
		for _, p := range pods {
			epochs[p.uid] = bs[p.uid][0].epoch
		}
	}
	record(a, b, g)

	// The bridge killed; pods come and go while it is down.
	r.bridge.kill(t)
	d := r.runPod(t, "d", "", -1, "")
	r.c.StopPod(t, a.id)
	r.c.RemovePod(t, a.id)
	r.c.StopPod(t, b.id) // stopped, not removed
	restarted := time.Now()
	r.bridge.start(t)
	r.bridge.waitHealthy(t, 10*time.Second)
	r.waitConverged(t, 10*time.Second, epochs, []*nriPod{d, g}, []*nriPod{a, b})
	t.Logf("the bridge restarted after a SIGKILL: converged %v after its start", time.Since(restarted).Round(time.Millisecond))
	record(d)

	// containerd restarted.
	e := r.runPod(t, "e", "", -1, "")
	r.waitBound(t, 2*time.Second, e)
	record(e)
	conns := r.bridge.metrics(t)["sandboxstats_nri_connections_total{}"]
	r.c.Stop(t)
	ctrdStopped := time.Now()
	r.c.Start(t)
	waitFor(t, 30*time.Second, func() bool {
		code, _ := r.bridge.health()
		return code == http.StatusOK && r.bridge.metrics(t)["sandboxstats_nri_connections_total{}"] > conns
	}, "statsnri to connect to the restarted containerd")
	t.Logf("statsnri connected again %v after containerd stopped", time.Since(ctrdStopped).Round(time.Millisecond))
	f := r.runPod(t, "f", "", -1, "")
	r.waitBound(t, 2*time.Second, f)
	record(f)
	// d predates the restart: NRI says nothing of its stop.
	r.c.StopPod(t, d.id)
	r.c.RemovePod(t, d.id)
	r.c.RemovePod(t, b.id)
	gone := time.Now()
	r.waitConverged(t, 5*resync+10*time.Second, epochs, []*nriPod{e, f, g}, []*nriPod{a, b, d})
	nm := r.bridge.metrics(t)
	t.Logf("a pod that predates containerd's restart, stopped and removed after it (no NRI event): its binding ended %v later; the bridge made %v connections, %v of them refreshes",
		time.Since(gone).Round(time.Millisecond), nm["sandboxstats_nri_connections_total{}"], nm["sandboxstats_nri_refreshes_total{}"])
}

// waitConverged waits up to d until the statsd hold exactly the running
// pods, each once, in the epoch recorded for it (if any), and hold one
// ended record for each ended pod and none else (no activation replaced,
// none of a running pod).
func (r *nriRig) waitConverged(t *testing.T, d time.Duration, epochs map[string]int64, running, ended []*nriPod) {
	t.Helper()
	var problems []string
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		problems = r.convergence(t, epochs, running, ended)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("not converged within %v:\n  %s\nstatsnri log:\n%s", d, strings.Join(problems, "\n  "), r.bridge.logTail(8000))
}

func (r *nriRig) convergence(t *testing.T, epochs map[string]int64, running, ended []*nriPod) []string {
	t.Helper()
	var problems []string
	bs, es := r.bindings(t), r.ended(t)
	names := map[string]string{}
	for _, p := range append(slices.Clone(running), ended...) {
		names[p.uid] = p.name
	}
	for _, p := range running {
		switch got := bs[p.uid]; {
		case len(got) != 1:
			problems = append(problems, fmt.Sprintf("running pod %s bound %d times", p.name, len(got)))
		case epochs[p.uid] != 0 && got[0].epoch != epochs[p.uid]:
			problems = append(problems, fmt.Sprintf("running pod %s bound again: epoch %d, first %d", p.name, got[0].epoch, epochs[p.uid]))
		}
	}
	for uid := range bs {
		if !slices.ContainsFunc(running, func(p *nriPod) bool { return p.uid == uid }) {
			problems = append(problems, fmt.Sprintf("bound, not running: %s %s", names[uid], uid))
		}
	}
	for _, p := range ended {
		switch got := es[p.uid]; {
		case len(got) != 1:
			problems = append(problems, fmt.Sprintf("ended pod %s has %d ended records", p.name, len(got)))
		case epochs[p.uid] != 0 && got[0].GetEpochUnixNano() != epochs[p.uid]:
			problems = append(problems, fmt.Sprintf("ended pod %s: its record's epoch %d, bound at %d", p.name, got[0].GetEpochUnixNano(), epochs[p.uid]))
		}
	}
	for uid, recs := range es {
		if !slices.ContainsFunc(ended, func(p *nriPod) bool { return p.uid == uid }) {
			problems = append(problems, fmt.Sprintf("an ended record of %s %s (%s), which has not ended", names[uid], uid, api.OutcomeName(recs[0].GetOutcome())))
		}
	}
	return problems
}

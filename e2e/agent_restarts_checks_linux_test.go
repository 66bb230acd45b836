package e2e

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// sends are the events that arrived, deduplicated by log.record.uid.
type sends struct {
	byUID              map[string][]sentEvent // every send of each uid
	finals, initials   map[string][]string    // actor -> the distinct uids of its finals, of its initials
	lost               []sentEvent
	events, duplicates map[string]int // by kind: distinct uids, sends beyond the first
}

func dedupSends(events []sentEvent) sends {
	s := sends{byUID: map[string][]sentEvent{}, finals: map[string][]string{}, initials: map[string][]string{},
		events: map[string]int{}, duplicates: map[string]int{}}
	for _, e := range events {
		prev := s.byUID[e.uid]
		s.byUID[e.uid] = append(prev, e)
		if len(prev) > 0 {
			s.duplicates[e.kind]++
			continue
		}
		s.events[e.kind]++
		switch e.kind {
		case "final":
			s.finals[e.actor] = append(s.finals[e.actor], e.uid)
		case "initial":
			s.initials[e.actor] = append(s.initials[e.actor], e.uid)
		case "lost":
			s.lost = append(s.lost, e)
		}
	}
	return s
}

// checkSends checks the events after deduplication (one final per
// activation, none missing, at most one initial, no lost records, the
// finals' CPU the truth's within 1%) and explains every uid sent more than
// once by the agent lives that emitted it.
func checkSends(t *testing.T, a *agentLives, s sends, actors []string, truth float64) {
	t.Helper()
	if s.byUID[""] != nil {
		t.Errorf("%d events without log.record.uid", len(s.byUID[""]))
	}
	for uid, copies := range s.byUID {
		for _, e := range copies[1:] {
			if e.kind != copies[0].kind || e.actor != copies[0].actor || e.cpu != copies[0].cpu {
				t.Errorf("uid %s sent as %+v and as %+v: the copies of one event differ", uid, copies[0], e)
			}
		}
	}
	var finalCPU float64
	var missing, twice []string
	for _, actor := range actors {
		switch f := s.finals[actor]; len(f) {
		case 0:
			missing = append(missing, actor)
		case 1:
			finalCPU += s.byUID[f[0]][0].cpu
		default:
			twice = append(twice, fmt.Sprintf("%s (%d)", actor, len(f)))
		}
		if len(s.initials[actor]) > 1 {
			t.Errorf("%s: %d initials of distinct uids", actor, len(s.initials[actor]))
		}
	}
	t.Logf("after deduplication by log.record.uid: %v events by kind, %v sends beyond the first; finals of %d of %d activations, their CPU %.3f s of the cgroups' %.3f (%.4f)",
		s.events, s.duplicates, len(actors)-len(missing), len(actors), finalCPU, truth, finalCPU/truth)
	if len(missing) > 0 {
		t.Errorf("no final for %d activations: %v", len(missing), missing)
	}
	if len(twice) > 0 {
		t.Errorf("finals of distinct uids for one activation: %v", twice)
	}
	if len(s.lost) > 0 {
		t.Errorf("%d lost events (no record was evicted): %+v", len(s.lost), s.lost)
	}
	if !within(finalCPU, truth, 0.01) {
		t.Errorf("final events' CPU %.3f s, cgroups' own %.3f s: off by more than 1%%", finalCPU, truth)
	}

	// Every uid sent more than once, explained by the lives that emitted
	// its copies (by the records' observed time, when the agent emitted
	// them): one emission sent again by the same life (an export whose
	// outcome was unknown), or emitted again by a later life (the first
	// life killed before its state recorded the Collector's
	// acknowledgement: the event still pending in the state file).
	var lines []string
	periodic := 0
	uids := make([]string, 0, len(s.byUID))
	for uid := range s.byUID {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		copies := s.byUID[uid]
		if len(copies) < 2 {
			continue
		}
		if copies[0].kind == "periodic" {
			if periodic++; periodic > 5 {
				continue
			}
		}
		var emitted []string
		seen := map[uint64]bool{}
		for _, e := range copies {
			if !seen[e.observed] {
				seen[e.observed] = true
				emitted = append(emitted, a.describeLife(a.lifeAt(e.observed)))
			}
		}
		why := "one emission sent again (an export of unknown outcome)"
		if len(emitted) > 1 {
			why = "pending in the state of a killed life, emitted again by a later one"
		}
		lines = append(lines, fmt.Sprintf("%s of %s (uid %s…): %d sends, %s; emitted by %s", copies[0].kind, copies[0].actor, uid[:8],
			len(copies), why, strings.Join(emitted, "; ")))
	}
	if periodic > 5 {
		lines = append(lines, fmt.Sprintf("... and %d more periodic events sent more than once", periodic-5))
	}
	t.Logf("uids sent more than once:\n%s", strings.Join(lines, "\n"))
}

// checkCounter checks the CPU counter over the whole run, the agent's
// restarts in it: the agent's own (its latest value) and, on the host,
// OTLP's (checkOTLPCounter) and Prometheus' increase() over a window from
// before the run's start.
func checkCounter(t *testing.T, c *churn, sink eventSink, began time.Time, truth float64) {
	t.Helper()
	const key = "sandboxstats_workload_cpu_seconds_total{sandbox_class=gvisor,source=cgroup,template_name=py,template_namespace=tmpl}"
	own := testenv.Scrape(t, c.agentURL)[key]
	t.Logf("the agent's CPU counter %.3f s (%.4f of the cgroups' %.3f)", own, own/truth, truth)
	if !within(own, truth, 0.01) {
		t.Errorf("the agent's CPU counter %.3f s, cgroups' own %.3f s: off by more than 1%%", own, truth)
	}
	if col, ok := sink.(collectorSink); ok {
		checkOTLPCounter(t, col, truth)
	}
	if c.prom == nil {
		t.Log("no Prometheus in the VM lane's guest: the host's run checks increase()")
		return
	}
	// increase() extrapolates at the window's edges: toward its start by
	// up to half the mean scrape interval, or to where the counter would
	// have been 0 if that is nearer; toward its end likewise. Over about
	// 60 s of 0.5 s scrapes half an interval is about 0.4% of the run, too
	// near the 1% bound. So the window starts before the series' first
	// sample, which zeroActivation made 0 (the extrapolation toward the
	// start is then 0), and the query is evaluated at the series' last
	// sample (none toward the end); the restarts' stale markers are not
	// samples, and a reset, if any, is counted as increase() counts it.
	const series = `sandboxstats_workload_cpu_seconds_total{source="cgroup"}`
	time.Sleep(1500 * time.Millisecond) // at least two scrapes after the agent's last sweep
	var last float64
	for _, s := range c.prom.Query(t, "timestamp("+series+")") {
		last = max(last, s.Value)
	}
	at := time.Unix(0, int64(math.Round(last*1000))*int64(time.Millisecond))
	window := fmt.Sprintf("%ds", int(at.Sub(began).Seconds())+10)
	inc := c.prom.QueryAt(t, "sum(increase("+series+"["+window+"]))", at)
	resets := c.prom.QueryAt(t, "sum(resets("+series+"["+window+"]))", at)
	if len(inc) != 1 || len(resets) != 1 {
		t.Fatalf("prometheus answered %v and %v", inc, resets)
	}
	t.Logf("prometheus at its last sample (%s): increase over %s %.3f s (%.4f of the cgroups' %.3f), %.0f resets",
		at.Format("15:04:05.000"), window, inc[0].Value, inc[0].Value/truth, truth, resets[0].Value)
	if resets[0].Value != 0 {
		t.Errorf("prometheus saw the CPU counter reset %.0f times: an agent restarted on its state continues it", resets[0].Value)
	}
	if !within(inc[0].Value, truth, 0.01) {
		t.Errorf("prometheus: increase of the CPU counter over the run %.3f s, cgroups' own %.3f s: off by more than 1%%", inc[0].Value, truth)
	}
}

// TestDedupSends: the kill loop's deduplication by log.record.uid keeps
// every copy of an id, counts the first by kind and the others as
// duplicates, and lists each actor's distinct finals and initials.
func TestDedupSends(t *testing.T) {
	ev := func(uid, kind, actor string) sentEvent { return sentEvent{uid: uid, kind: kind, actor: actor} }
	type tally struct {
		Events, Dups     map[string]int
		Finals, Initials map[string][]string
		Lost, CopiesOfF1 int // lost events; sends of uid f1
	}
	for _, c := range []struct {
		name             string
		in               []sentEvent
		events, dups     map[string]int
		finals, initials map[string][]string
		lost, copiesOfF1 int
	}{
		{name: "nothing sent", events: map[string]int{}, dups: map[string]int{}, finals: map[string][]string{}, initials: map[string][]string{}},
		{
			name:   "a final sent again after a kill, an initial once",
			in:     []sentEvent{ev("i1", "initial", "a"), ev("f1", "final", "a"), ev("f1", "final", "a")},
			events: map[string]int{"initial": 1, "final": 1}, dups: map[string]int{"final": 1},
			finals: map[string][]string{"a": {"f1"}}, initials: map[string][]string{"a": {"i1"}}, copiesOfF1: 2,
		},
		{
			name:   "two finals of distinct uids for one actor, a lost event",
			in:     []sentEvent{ev("f1", "final", "a"), ev("f2", "final", "a"), ev("l1", "lost", "")},
			events: map[string]int{"final": 2, "lost": 1}, dups: map[string]int{},
			finals: map[string][]string{"a": {"f1", "f2"}}, initials: map[string][]string{}, lost: 1, copiesOfF1: 1,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := dedupSends(c.in)
			got := tally{s.events, s.duplicates, s.finals, s.initials, len(s.lost), len(s.byUID["f1"])}
			want := tally{c.events, c.dups, c.finals, c.initials, c.lost, c.copiesOfF1}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// checkOTLPCounter checks container.cpu.time as the Collector got it over
// the agent's lives: its latest cumulative value equals the truth within
// 1% (waiting up to 10 s for the last export), and each attribute set kept
// one start time (no reset for OTLP either).
func checkOTLPCounter(t *testing.T, col collectorSink, truth float64) {
	t.Helper()
	const match = "sandboxstats.stats.source=cgroup"
	var pts []testenv.CollectedPoint
	var latest float64
	var sets int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pts = col.Metrics(t)
		if latest, sets = latestCounter(pts, "container.cpu.time", match); within(latest, truth, 0.01) || time.Now().After(deadline) {
			break
		}
	}
	starts := map[uint64]bool{}
	for _, p := range pts {
		if p.Metric == "container.cpu.time" && p.Attributes["sandboxstats.stats.source"] == "cgroup" {
			starts[p.StartUnixNano] = true
		}
	}
	t.Logf("OTLP: container.cpu.time latest %.3f s over %d attribute sets (%.4f of the cgroups' %.3f), %d start times", latest, sets, latest/truth, truth, len(starts))
	if !within(latest, truth, 0.01) {
		t.Errorf("OTLP: container.cpu.time %.3f s, cgroups' own %.3f s: off by more than 1%%", latest, truth)
	}
	if len(starts) != sets {
		t.Errorf("OTLP: container.cpu.time's %d attribute sets had %d start times: a reset", sets, len(starts))
	}
}

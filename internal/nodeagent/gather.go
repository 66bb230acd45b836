package nodeagent

import (
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// sweepGatherer is what /metrics serves: the agent's own metrics (sweep,
// an Agent's registry), which change only with a sweep, gathered once per
// sweep and served again until the next one, and the runtime's (live: the
// Go and process collectors), gathered at every scrape. With 1000
// workloads and actor labels, gathering (checking and sorting 24,000
// metrics) was half of a scrape; encoding them is what is left.
//
// A sweep is a snapshot stored by Apply, which stores it after every other
// metric of the sweep changed. The two registries' metric names are apart
// (sandboxstats_ and promhttp_, go_ and process_).
type sweepGatherer struct {
	sweep, live prometheus.Gatherer
	metrics     *metrics

	mu   sync.Mutex
	key  *snapshot // the snapshot fams were gathered at
	fams []*dto.MetricFamily
	err  error
}

// Gather implements prometheus.Gatherer. The families it returns from the
// cache are shared by the scrapes of one sweep: read, never changed.
func (g *sweepGatherer) Gather() ([]*dto.MetricFamily, error) {
	_, fams, err := g.sweepFamilies()
	live, lerr := g.live.Gather()
	out := make([]*dto.MetricFamily, 0, len(fams)+len(live))
	out = append(append(out, fams...), live...)
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, errors.Join(err, lerr)
}

// sweepFamilies returns the sweep registry's families and the snapshot
// they were gathered at.
func (g *sweepGatherer) sweepFamilies() (*snapshot, []*dto.MetricFamily, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if snap := g.metrics.snap.Load(); snap != g.key {
		g.fams, g.err = g.sweep.Gather()
		g.key = snap
	}
	return g.key, g.fams, g.err
}

package nodeagent

// This file produces the workload counters over OTLP (otelCounters) as the
// agent's own cumulative sums, each point with its label set's start: the
// SDK's observable counters would give every point the instrument's
// creation, so after a restart a counter continued from --state-dir would
// carry a new start time, which OTLP reads as a reset (a consumer trusting
// start times would count the whole continued value again).

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// overflowSet is the attributes of the point past the cardinality limit,
// as the SDK names it.
var overflowSet = attribute.NewSet(attribute.Bool("otel.metric.overflow", true))

// otelCounterNames are otelCounters' metric names, each once, in their
// order; each name's first entry has its unit and description.
var otelCounterNames = func() []string {
	var names []string
	for _, c := range otelCounters {
		if !slices.Contains(names, c.name) {
			names = append(names, c.name)
		}
	}
	return names
}()

// counterAttrs are one label set's attribute sets of the counters' points,
// made once while the label set is in the snapshots: its own, and with a
// counter's extra attribute or an interface.
type counterAttrs struct {
	base  attribute.Set
	extra map[rate.CounterID]attribute.Set
}

// of returns the attribute set of counter id's point.
func (ca *counterAttrs) of(id rate.CounterID) attribute.Set {
	oc := otelCounters[id.Counter]
	if oc.extra.Key == "" && id.Interface == "" {
		return ca.base
	}
	if set, ok := ca.extra[id]; ok {
		return set
	}
	kv := ca.base.ToSlice()
	if oc.extra.Key != "" {
		kv = append(kv, oc.extra)
	}
	if id.Interface != "" {
		kv = append(kv, attribute.String(attrNetInterface, id.Interface))
	}
	set := attribute.NewSet(kv...)
	if ca.extra == nil {
		ca.extra = map[rate.CounterID]attribute.Set{}
	}
	ca.extra[id] = set
	return set
}

// counterStream is one counter metric's points; past the cardinality
// limit (limit-1 attribute sets, as the SDK) the rest are summed into one
// overflow point.
type counterStream[N int64 | float64] struct {
	points []metricdata.DataPoint[N]
	over   *metricdata.DataPoint[N]
}

func (s *counterStream[N]) add(set attribute.Set, start, now time.Time, v N, limit int) {
	if limit <= 0 || len(s.points) < limit-1 {
		s.points = append(s.points, metricdata.DataPoint[N]{Attributes: set, StartTime: start, Time: now, Value: v})
		return
	}
	if s.over == nil {
		s.over = &metricdata.DataPoint[N]{Attributes: overflowSet, StartTime: start, Time: now}
	}
	if sum := s.over.Value + v; sum >= s.over.Value {
		s.over.Value = sum
	} else { // an int64 past its largest: saturate
		s.over.Value = N(math.MaxInt64)
	}
	if start.Before(s.over.StartTime) {
		s.over.StartTime = start
	}
}

func (s *counterStream[N]) sum() metricdata.Sum[N] {
	if s.over != nil {
		s.points = append(s.points, *s.over)
	}
	return metricdata.Sum[N]{DataPoints: s.points, Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}
}

// counters returns snap's workload counters as cumulative sums at now,
// each point starting at its label set's first charge; at most limit
// attribute sets a metric (0: no limit), the oldest label sets first.
// kept are the attribute sets of the last call; the returned map holds
// those of this one.
func counters(snap *snapshot, withActor bool, limit int, now time.Time, kept map[labelSet]*counterAttrs) ([]metricdata.Metrics, map[labelSet]*counterAttrs) {
	sets := make([]labelSet, 0, len(snap.counters))
	for l := range snap.counters {
		sets = append(sets, l)
	}
	// The oldest first: past the limit, the newest series fold.
	slices.SortFunc(sets, func(x, y labelSet) int {
		return cmp.Or(snap.counters[x].start.Compare(snap.counters[y].start), compareLabels(x, y))
	})
	floats, ints := map[string]*counterStream[float64]{}, map[string]*counterStream[int64]{}
	count := func(id rate.CounterID, set attribute.Set, start time.Time, v uint64) {
		oc := otelCounters[id.Counter]
		if oc.scale != 0 {
			s := floats[oc.name]
			if s == nil {
				s = &counterStream[float64]{}
				floats[oc.name] = s
			}
			s.add(set, start, now, float64(v)*oc.scale, limit)
			return
		}
		s := ints[oc.name]
		if s == nil {
			s = &counterStream[int64]{}
			ints[oc.name] = s
		}
		s.add(set, start, now, clampInt64(v), limit)
	}
	seen := make(map[labelSet]*counterAttrs, len(sets))
	for _, l := range sets {
		ca := kept[l]
		if ca == nil {
			ca = &counterAttrs{base: attribute.NewSet(workloadAttrs(l, withActor)...)}
		}
		seen[l] = ca
		cv := snap.counters[l]
		for c, v := range cv.total {
			if cv.has[c] {
				id := rate.CounterID{Counter: rate.Counter(c)}
				count(id, ca.of(id), cv.start, v)
			}
		}
		ifaces := make([]rate.CounterID, 0, len(cv.perInterface))
		for id := range cv.perInterface {
			ifaces = append(ifaces, id)
		}
		slices.SortFunc(ifaces, func(x, y rate.CounterID) int {
			return cmp.Or(cmp.Compare(x.Counter, y.Counter), strings.Compare(x.Interface, y.Interface))
		})
		for _, id := range ifaces {
			count(id, ca.of(id), cv.start, cv.perInterface[id])
		}
	}
	var out []metricdata.Metrics
	for _, name := range otelCounterNames {
		i := slices.IndexFunc(otelCounters[:], func(c otelCounter) bool { return c.name == name })
		m := metricdata.Metrics{Name: name, Unit: otelCounters[i].unit, Description: otelCounters[i].help}
		if s := floats[name]; s != nil {
			m.Data = s.sum()
		} else if s := ints[name]; s != nil {
			m.Data = s.sum()
		} else {
			continue
		}
		out = append(out, m)
	}
	return out, seen
}

func compareLabels(x, y labelSet) int {
	return cmp.Or(strings.Compare(x.class, y.class), strings.Compare(x.source, y.source),
		strings.Compare(x.templateNamespace, y.templateNamespace), strings.Compare(x.templateName, y.templateName), strings.Compare(x.workerPool, y.workerPool),
		strings.Compare(x.actorUID, y.actorUID), strings.Compare(x.actorName, y.actorName), strings.Compare(x.actorNamespace, y.actorNamespace))
}

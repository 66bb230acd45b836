package nodeagent

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.descCur, m.descWS, m.descPeak, m.descLimit, m.descPids, m.descSampled, m.descDaemons, m.descDrift} {
		ch <- d
	}
	for _, d := range m.descCounters {
		ch <- d
	}
	for _, d := range m.containerDescs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector over the latest snapshot. The
// metrics of one label set share its label pairs, made once (with 1000
// workloads and actor labels, making each of the 24,000 metrics' own was
// most of a scrape's cost).
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	snap := m.snap.Load()
	wa := m.cfg.LabelActor
	names := m.labelNames
	add := func(desc *prometheus.Desc, t prometheus.ValueType, v float64, pairs []*dto.LabelPair, err error) {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(desc, err)
			return
		}
		ch <- newSnapMetric(desc, t, v, pairs)
	}
	for l, sv := range snap.series {
		pairs, err := labelPairs(names, l.values(wa))
		add(m.descSampled, prometheus.GaugeValue, float64(sv.workloads), pairs, err)
		if l.source == unmeasuredSource || l.source == unknownLabel {
			continue // not measured, or a layer this build cannot compare: no numbers, not zeros
		}
		add(m.descCur, prometheus.GaugeValue, float64(sv.current), pairs, err)
		add(m.descWS, prometheus.GaugeValue, float64(sv.wset), pairs, err)
		if !sv.peakIncomplete {
			add(m.descPeak, prometheus.GaugeValue, float64(sv.peak), pairs, err)
		}
		if !sv.limitMissing {
			add(m.descLimit, prometheus.GaugeValue, float64(sv.limit), pairs, err)
		}
		if !sv.pidsMissing {
			add(m.descPids, prometheus.GaugeValue, float64(sv.pids), pairs, err)
		}
	}
	ifNames := append(names[:len(names):len(names)], "interface")
	// A counter's created timestamp is its label set's start (kept across
	// restarts): a scraper reading it (protobuf) sees no reset at a restart.
	count := func(c rate.Counter, v uint64, pairs []*dto.LabelPair, err error, created *timestamppb.Timestamp) {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(m.descCounters[c], err)
			return
		}
		s := newSnapMetric(m.descCounters[c], prometheus.CounterValue, float64(v)*counterMetrics[c].scale, pairs)
		s.count.CreatedTimestamp = created
		ch <- s
	}
	for l, cv := range snap.counters {
		lv := l.values(wa)
		pairs, err := labelPairs(names, lv)
		created := timestamppb.New(cv.start)
		for c, v := range cv.total {
			if cv.has[c] {
				count(rate.Counter(c), v, pairs, err, created)
			}
		}
		for id, v := range cv.perInterface {
			p, perr := labelPairs(ifNames, append(lv, id.Interface))
			count(id.Counter, v, p, perr, created)
		}
	}
	m.collectContainers(ch, snap)
	driftNames := append([]string{"kind"}, names...)
	for k, n := range snap.drift {
		pairs, err := labelPairs(driftNames, append([]string{k.kind}, k.labels.values(wa)...))
		add(m.descDrift, prometheus.GaugeValue, float64(n), pairs, err)
	}
	for _, st := range []sweep.Status{sweep.StatusOK, sweep.StatusNoSample, sweep.StatusVanished, sweep.StatusError, sweep.StatusSkipped} {
		pairs, err := labelPairs([]string{"result"}, []string{string(st)})
		add(m.descDaemons, prometheus.GaugeValue, float64(snap.daemons[st]), pairs, err)
	}
}

// labelPairs returns the label pairs of names and values, sorted by name
// as a metric's must be, with the checks prometheus.NewConstMetric makes
// of label values.
func labelPairs(names, values []string) ([]*dto.LabelPair, error) {
	if len(names) != len(values) {
		return nil, fmt.Errorf("nodeagent: %d label values for %d labels", len(values), len(names))
	}
	strs := append(slices.Clone(names), values...) // the pairs' own: callers reuse theirs
	pairs := make([]*dto.LabelPair, len(names))
	for i, n := range names {
		if !utf8.ValidString(values[i]) {
			return nil, fmt.Errorf("nodeagent: label %s: value %q is not valid UTF-8", n, values[i])
		}
		pairs[i] = &dto.LabelPair{Name: &strs[i], Value: &strs[len(names)+i]}
	}
	slices.SortFunc(pairs, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	return pairs, nil
}

// snapMetric is a gauge or counter of a snapshot: a constant, its label
// pairs shared with the other metrics of its label set. A scrape treats
// what Write gives it as immutable, as it does the label pairs of every
// client_golang metric.
type snapMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	kind   prometheus.ValueType // GaugeValue or CounterValue
	value  float64
	gauge  dto.Gauge
	count  dto.Counter
}

func newSnapMetric(desc *prometheus.Desc, kind prometheus.ValueType, v float64, pairs []*dto.LabelPair) *snapMetric {
	s := &snapMetric{desc: desc, labels: pairs, kind: kind, value: v}
	s.gauge.Value, s.count.Value = &s.value, &s.value
	return s
}

// Desc implements prometheus.Metric.
func (s *snapMetric) Desc() *prometheus.Desc { return s.desc }

// Write implements prometheus.Metric.
func (s *snapMetric) Write(out *dto.Metric) error {
	out.Label = s.labels
	if s.kind == prometheus.GaugeValue {
		out.Gauge = &s.gauge
	} else {
		out.Counter = &s.count
	}
	return nil
}

package nodeagent

import (
	"github.com/prometheus/client_golang/prometheus"

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
}

// Collect implements prometheus.Collector over the latest snapshot.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	snap := m.snap.Load()
	wa := m.cfg.LabelActor
	for l, sv := range snap.series {
		lv := l.values(wa)
		ch <- prometheus.MustNewConstMetric(m.descSampled, prometheus.GaugeValue, float64(sv.workloads), lv...)
		if l.source == unmeasuredSource || l.source == unknownLabel {
			continue // not measured, or a layer this build cannot compare: no numbers, not zeros
		}
		ch <- prometheus.MustNewConstMetric(m.descCur, prometheus.GaugeValue, float64(sv.current), lv...)
		ch <- prometheus.MustNewConstMetric(m.descWS, prometheus.GaugeValue, float64(sv.wset), lv...)
		if !sv.peakIncomplete {
			ch <- prometheus.MustNewConstMetric(m.descPeak, prometheus.GaugeValue, float64(sv.peak), lv...)
		}
		if !sv.limitMissing {
			ch <- prometheus.MustNewConstMetric(m.descLimit, prometheus.GaugeValue, float64(sv.limit), lv...)
		}
		if !sv.pidsMissing {
			ch <- prometheus.MustNewConstMetric(m.descPids, prometheus.GaugeValue, float64(sv.pids), lv...)
		}
	}
	for l, values := range snap.counters {
		lv := l.values(wa)
		for id, v := range values {
			cm := counterMetrics[id.Counter]
			labels := lv
			if id.Interface != "" {
				labels = append(lv[:len(lv):len(lv)], id.Interface)
			}
			ch <- prometheus.MustNewConstMetric(m.descCounters[id.Counter], prometheus.CounterValue, float64(v)*cm.scale, labels...)
		}
	}
	for k, n := range snap.drift {
		ch <- prometheus.MustNewConstMetric(m.descDrift, prometheus.GaugeValue, float64(n), append([]string{k.kind}, k.labels.values(wa)...)...)
	}
	for _, st := range []sweep.Status{sweep.StatusOK, sweep.StatusNoSample, sweep.StatusVanished, sweep.StatusError, sweep.StatusSkipped} {
		ch <- prometheus.MustNewConstMetric(m.descDaemons, prometheus.GaugeValue, float64(snap.daemons[st]), string(st))
	}
}

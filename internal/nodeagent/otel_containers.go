package nodeagent

// The per-container series over OTLP (containers.go): the CPU counter
// produced as the workload counters are (each point with its series'
// start), the gauges observed from the snapshot.

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// attrContainer is the container attribute (Prometheus label container).
const attrContainer = "sandboxstats.container.name"

// containerInstruments are the per-container gauges and the folds.
type containerInstruments struct {
	memUsage, memWorkingSet, pids metric.Int64Observable
	folded                        metric.Int64Counter
}

func newContainerInstruments(meter metric.Meter) (containerInstruments, error) {
	var ci containerInstruments
	var err error
	if ci.memUsage, err = meter.Int64ObservableUpDownCounter("sandboxstats.container.memory.usage", metric.WithUnit("By"),
		metric.WithDescription("Memory charged now to each container (layer: source), summed; absent where the source has no figure of the container's own.")); err != nil {
		return ci, err
	}
	if ci.memWorkingSet, err = meter.Int64ObservableUpDownCounter("sandboxstats.container.memory.working_set", metric.WithUnit("By"),
		metric.WithDescription("Memory minus inactive file pages of each container, summed; absent where the source has none of the container's own.")); err != nil {
		return ci, err
	}
	if ci.pids, err = meter.Int64ObservableGauge("sandboxstats.container.pids", metric.WithUnit("{process}"),
		metric.WithDescription("Processes (tasks) of each container, summed; absent where the source offers none.")); err != nil {
		return ci, err
	}
	ci.folded, err = meter.Int64Counter("sandboxstats.agent.containers_folded", metric.WithUnit("{container}"),
		metric.WithDescription("Containers exported as (other): their workload had more than --max-containers."))
	return ci, err
}

// containerSet is a per-container series' attributes.
func containerSet(k containerKey, withActor bool) attribute.Set {
	return attribute.NewSet(append(workloadAttrs(k.labels, withActor), attribute.String(attrContainer, k.container))...)
}

// observeContainers reports snap's per-container gauges.
func (ci *containerInstruments) observeContainers(obs metric.Observer, snap *snapshot, withActor bool) {
	for k, cv := range snap.containers {
		if k.cadvisor || !cv.sampled || !cv.running {
			continue
		}
		opt := metric.WithAttributeSet(containerSet(k, withActor))
		if !cv.noCurrent {
			obs.ObserveInt64(ci.memUsage, clampInt64(cv.current), opt)
		}
		if !cv.noWset {
			obs.ObserveInt64(ci.memWorkingSet, clampInt64(cv.wset), opt)
		}
		if !cv.noPids {
			obs.ObserveInt64(ci.pids, clampInt64(cv.pids), opt)
		}
	}
}

// containerFolded counts n containers folded.
func (o *otelMetrics) containerFolded(n int) {
	if n > 0 {
		o.containers.folded.Add(context.Background(), int64(n))
	}
}

// containerCounters returns snap's per-container CPU counters as a
// cumulative sum at now, the oldest series first, at most limit points
// (0: no limit; past it the rest in one overflow point).
func containerCounters(snap *snapshot, withActor bool, limit int, now time.Time) (metricdata.Metrics, bool) {
	keys := make([]containerKey, 0, len(snap.containers))
	for k := range snap.containers {
		if !k.cadvisor {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return metricdata.Metrics{}, false
	}
	slices.SortFunc(keys, func(x, y containerKey) int {
		return cmp.Or(snap.containers[x].start.Compare(snap.containers[y].start), compareLabels(x.labels, y.labels), strings.Compare(x.container, y.container))
	})
	var s counterStream[float64]
	for _, k := range keys {
		cv := snap.containers[k]
		s.add(containerSet(k, withActor), cv.start, now, float64(cv.cpu)*1e-6, limit)
	}
	return metricdata.Metrics{Name: "sandboxstats.container.cpu.time", Unit: "s",
		Description: "CPU time of each container, charged like container.cpu.time (head, body, tail, across restarts).", Data: s.sum()}, true
}

package nribridge

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
)

// metrics are the bridge's counters and gauges (docs/nri.md lists them).
type metrics struct {
	b            *Bridge
	connections  prometheus.Counter
	refreshes    prometheus.Counter
	events       *prometheus.CounterVec
	ignored      *prometheus.CounterVec
	unactionable *prometheus.CounterVec
	calls        *prometheus.CounterVec
	spilled      *prometheus.CounterVec
	logDropped   prometheus.Counter

	connected, pods, held, queued *prometheus.Desc
}

func newMetrics(b *Bridge) *metrics {
	return &metrics{
		b: b,
		connections: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandboxstats_nri_connections_total",
			Help: "Connections to NRI that registered the plugin (the first, and every reconnect)."}),
		refreshes: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandboxstats_nri_refreshes_total",
			Help: "Reconnections to NRI made for a fresh Synchronize: at a --resync while pods known from a Synchronize only are tracked (the runtime may not relay their end)."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxstats_nri_events_total",
			Help: "NRI events and requests received, by event; each is answered at once."}, []string{"event"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxstats_nri_pod_events_ignored_total",
			Help: "Pod events that change nothing, by reason: handler (a runtime handler not watched), stale-sandbox (an older sandbox of a pod), invalid-pod-uid."}, []string{"reason"}),
		unactionable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxstats_nri_unactionable_total",
			Help: "Pods of watched handlers the bridge could not bind as they are, by reason (each also logged, at most once per reason every 10s)."}, []string{"reason"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxstats_nri_statsd_calls_total",
			Help: "Calls to statsd (run, checkpoint, list) by statsd lifecycle socket and result: ok, or the ErrorInfo reason or gRPC code of the failure."}, []string{"statsd", "call", "result"}),
		spilled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxstats_nri_placement_spills_total",
			Help: "Pods placed past a statsd of their order, by reason: statsd-full (it refused them TOO_MANY_WORKLOADS), namespace-cap (it holds --namespace-cap pods of their namespace)."}, []string{"reason"}),
		logDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandboxstats_nri_log_records_dropped_total",
			Help: "Log records of event handlers dropped because the log queue was full (a blocked stderr never blocks a handler)."}),
		connected: prometheus.NewDesc("sandboxstats_nri_connected", "1 while connected to NRI and synchronized, else 0.", nil, nil),
		pods:      prometheus.NewDesc("sandboxstats_nri_pods", "Running pods of watched handlers the bridge tracks.", nil, nil),
		held:      prometheus.NewDesc("sandboxstats_nri_statsd_bindings", "Bindings each statsd holds as far as the bridge knows.", []string{"statsd"}, nil),
		queued:    prometheus.NewDesc("sandboxstats_nri_statsd_pending", "Pods queued, being worked on or waiting to retry, per statsd.", []string{"statsd"}, nil),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.connections, m.refreshes, m.events, m.ignored, m.unactionable, m.calls, m.spilled, m.logDropped, m} {
		errs = append(errs, r.Register(c))
	}
	return errors.Join(errs...)
}

func (m *metrics) event(name string) { m.events.WithLabelValues(name).Inc() }

func (m *metrics) call(statsd, call string, err error) {
	result := "ok"
	if err != nil {
		if result = api.ReasonOf(err); result == "" {
			result = status.Code(err).String()
		}
	}
	m.calls.WithLabelValues(statsd, call, result).Inc()
}

// Describe and Collect serve the gauges read from the bridge's state.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.connected, m.pods, m.held, m.queued} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	up := 0.0
	if b.connected && b.synced {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(m.connected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(m.pods, prometheus.GaugeValue, float64(len(b.pods)))
	for _, s := range b.shards {
		ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, float64(len(s.known)), s.label)
		pending := map[string]bool{}
		for _, set := range []map[string]bool{s.queued, s.busy} {
			for uid := range set {
				pending[uid] = true
			}
		}
		for uid := range s.retry {
			pending[uid] = true
		}
		ch <- prometheus.MustNewConstMetric(m.queued, prometheus.GaugeValue, float64(len(pending)), s.label)
	}
}

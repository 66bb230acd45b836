package nodeagent

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// Metric names of the Accountant's refusals.
const (
	metricImplausibleSamples = "sandboxstats_agent_implausible_samples_total"
	metricEndedEvicted       = "sandboxstats_agent_ended_records_evicted_total"
)

// refusedCollector exports what the Accountant refused (rate.Refused): the
// samples and ended records that charged nothing, by reason, and the ended
// records forgotten at its cap. It reads the Accountant's atomic counts, so
// a scrape never waits for a sweep.
type refusedCollector struct {
	acct              *rate.Accountant
	overflows         *atomic.Uint64
	implausible, evic *prometheus.Desc
}

// reasonOverflow: a charge refused because it would have made a shared
// total overflow (metrics.charge; not the Accountant's).
const reasonOverflow = "overflow"

func newRefusedCollector(acct *rate.Accountant, overflows *atomic.Uint64) refusedCollector {
	return refusedCollector{
		acct: acct, overflows: overflows,
		implausible: prometheus.NewDesc(metricImplausibleSamples,
			"Samples and ended records refused, whole or a counter of them, by reason: growth (a counter grew more than its bound allows in the time since the last sample, or since the epoch for a head of bytes or counts: CPU and stall time the node's CPUs x the time, periods one per ms, bytes 2^40/s, packets, IOs and kills 2^32/s; only that counter charges nothing, once per sample), absurd (a counter at 2^62 or more: nothing of the sample charged), overflow (a charge that would have made a shared total overflow, refused). Their activation continues from their values.",
			[]string{"reason"}, nil),
		evic: prometheus.NewDesc(metricEndedEvicted,
			"Ended records forgotten before the horizon because the most the agent remembers were (oldest first): one served again afterwards is charged again.",
			nil, nil),
	}
}

func (c refusedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.implausible; ch <- c.evic }

func (c refusedCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.acct.Refused()
	for _, r := range []rate.Refusal{rate.RefusedGrowth, rate.RefusedAbsurd} {
		ch <- prometheus.MustNewConstMetric(c.implausible, prometheus.CounterValue, float64(n[r]), string(r))
	}
	ch <- prometheus.MustNewConstMetric(c.implausible, prometheus.CounterValue, float64(c.overflows.Load()), reasonOverflow)
	ch <- prometheus.MustNewConstMetric(c.evic, prometheus.CounterValue, float64(n[rate.RefusedEndedEvicted]))
}

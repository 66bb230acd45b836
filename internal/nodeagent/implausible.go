package nodeagent

import (
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
	implausible, evic *prometheus.Desc
}

func newRefusedCollector(acct *rate.Accountant) refusedCollector {
	return refusedCollector{
		acct: acct,
		implausible: prometheus.NewDesc(metricImplausibleSamples,
			"Samples and ended records that charged nothing, by reason: growth (a CPU, stall or period counter grew more than the node's CPUs x the time since the last sample allow), absurd (a counter at 2^62 or more). Their activation continues from their values; no series is charged.",
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
	ch <- prometheus.MustNewConstMetric(c.evic, prometheus.CounterValue, float64(n[rate.RefusedEndedEvicted]))
}

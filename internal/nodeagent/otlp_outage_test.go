package nodeagent

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/otlp"
)

// sumFamily sums the values of the named family's series in g.
func sumFamily(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// heapAfterGC is the live heap after a collection: the least of three
// samples 100 ms apart, since the pipeline's export loop may be holding a
// collection of 24,000 points (several MiB) at any one of them.
func heapAfterGC() uint64 {
	least := ^uint64(0)
	for i := range 3 {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		least = min(least, ms.HeapAlloc)
	}
	return least
}

// TestOutageMemoryFlat: an agent of 1000 workloads pushing to a collector
// that is down for 300 sweeps (a 5-minute outage at 1 s sweeps; 75 minutes
// at the 15 s floor), a periodic event of every workload at every sweep:
// the event queue stays within
// its bounds, every event not kept is counted dropped, and the heap does
// not grow.
func TestOutageMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("300 sweeps of 1000 workloads")
	}
	const sweeps, queue = 300, 4096
	dists := NewDistributions()
	p, err := otlp.New(otlp.Config{Endpoint: "unix://" + filepath.Join(t.TempDir(), "nobody.sock"), Timeout: time.Second, QueueRecords: queue, Producer: dists}, discard())
	if err != nil {
		t.Fatal(err)
	}
	pipeReg := prometheus.NewRegistry()
	pipeReg.MustRegister(p.Collectors()...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	t0 := time.Now()
	m, err := newMetrics(prometheus.NewRegistry(), metricsConfig{Grace: time.Hour, Started: t0.Add(-time.Hour), CPUs: 2, LabelActor: true,
		OTel: &OTel{Meters: p.Meters(), Loggers: p.Loggers(), PeriodicEvery: 1, Swept: p.Swept, Distributions: dists}}, discard())
	if err != nil {
		t.Fatal(err)
	}
	results := benchResults(benchDaemons, t0)
	var heapAt30 uint64
	var slowest time.Duration
	for i := range sweeps {
		at := t0.Add(time.Duration(i+1) * time.Second)
		advance(results, at)
		start := time.Now()
		m.Apply(results, at, time.Millisecond)
		p.Swept()
		slowest = max(slowest, time.Since(start))
		if i == 29 {
			heapAt30 = heapAfterGC()
		}
	}
	heapEnd := heapAfterGC()
	queued, dropped, sent := sumFamily(t, pipeReg, "sandboxstats_agent_otlp_queue_records"),
		sumFamily(t, pipeReg, "sandboxstats_agent_otlp_events_dropped_total"), sumFamily(t, pipeReg, "sandboxstats_agent_otlp_events_sent_total")
	const offered = sweeps * benchDaemons // an initial, then periodic events
	if queued > queue*3/4 || queued+dropped+sent != offered {
		t.Errorf("events: %v queued (bound %d for periodic ones), %v dropped, %v sent; want them to add up to the %d offered", queued, queue*3/4, dropped, sent, offered)
	}
	t.Logf("events: %v queued, %v dropped (counted), %v sent of %d", queued, dropped, sent, offered)
	t.Logf("heap after 30 sweeps %.1f MiB, after %d %.1f MiB (x%.3f); slowest Apply %v", float64(heapAt30)/(1<<20), sweeps, float64(heapEnd)/(1<<20),
		float64(heapEnd)/float64(heapAt30), slowest)
	if heapEnd > heapAt30+heapAt30/10 {
		t.Errorf("heap grew from %d to %d bytes across the outage (more than 10%%)", heapAt30, heapEnd)
	}
}

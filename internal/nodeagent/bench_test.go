package nodeagent

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
)

const benchDaemons = 1000

// benchResults is a sweep of n daemons, each answering one workload with
// every signal (see signalSample).
func benchResults(n int, epoch time.Time) []sweep.DaemonResult {
	results := make([]sweep.DaemonResult, n)
	for i := range results {
		results[i] = okResult(fmt.Sprintf("/run/statsd/d%04d.sock", i), signalSample(fmt.Sprintf("actor-%04d", i), epoch, epoch, 0))
	}
	return results
}

// advance makes results the answers of the sweep at: each workload 10 ms
// of CPU further.
func advance(results []sweep.DaemonResult, at time.Time) {
	for _, r := range results {
		for _, s := range r.Samples {
			*s.CpuUsageUsec += 10_000
			s.ObservedAtUnixNano = at.UnixNano()
		}
	}
}

// BenchmarkScrape1000 and BenchmarkScrape1000Gzip: a /metrics scrape of
// an agent that sweeps 1000 daemons of one workload each, actor labels on
// (one series set per workload, every signal: 24,000 series), against its
// floor: encoding alone the same metric families, gathered once, in the
// format the scrape negotiates (baseline). Scrape1000Gzip asks as
// Prometheus does (Accept-Encoding: gzip): its floor is the encoding and
// the compression.
//
//   - scrape: a scrape of a sweep already scraped (a sweep's snapshot is
//     scraped until the next sweep).
//   - scrape-new-sweep: the first scrape after a sweep (Apply not timed).
func BenchmarkScrape1000(b *testing.B)     { benchScrape(b, false) }
func BenchmarkScrape1000Gzip(b *testing.B) { benchScrape(b, true) }

func benchScrape(b *testing.B, gzipped bool) {
	t0 := time.Now()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: 10 * time.Minute, Started: t0.Add(-time.Hour), CPUs: 2}, discard())
	if err != nil {
		b.Fatal(err)
	}
	results := benchResults(benchDaemons, t0)
	for i := range 2 {
		at := t0.Add(time.Duration(i) * time.Minute)
		advance(results, at)
		m.Apply(results, at, time.Second)
	}
	a := &Agent{reg: reg, live: prometheus.NewRegistry(), metrics: m}
	h := a.Handler()
	req := httptest.NewRequest("GET", "/metrics", nil)
	if gzipped {
		req.Header.Set("Accept", "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
		req.Header.Set("Accept-Encoding", "gzip")
	}
	scrape := func(b *testing.B) int {
		var w discardWriter
		h.ServeHTTP(&w, req)
		if w.code != http.StatusOK {
			b.Fatalf("scrape: %d", w.code)
		}
		return w.n
	}
	b.Logf("/metrics: %d bytes (gzip %v)", scrape(b), gzipped)
	b.Run("baseline", func(b *testing.B) {
		fams, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		format := expfmt.NegotiateAccept(req.Header, expfmt.DefaultAcceptedFormats()...) // as promhttp does
		gz := gzip.NewWriter(io.Discard)
		for b.Loop() {
			var w io.Writer = io.Discard
			if gzipped {
				gz.Reset(io.Discard)
				w = gz
			}
			enc := expfmt.NewEncoder(w, format)
			for _, f := range fams {
				if err := enc.Encode(f); err != nil {
					b.Fatal(err)
				}
			}
			if gzipped {
				if err := gz.Close(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("scrape", func(b *testing.B) {
		for b.Loop() {
			scrape(b)
		}
	})
	b.Run("scrape-new-sweep", func(b *testing.B) {
		snap := m.snap.Load()
		for b.Loop() {
			m.snap.Store(&snapshot{drift: snap.drift, series: snap.series, counters: snap.counters, daemons: snap.daemons})
			scrape(b)
		}
	})
}

// discardWriter is an http.ResponseWriter that keeps only the status and
// the body's length.
type discardWriter struct {
	header http.Header
	code   int
	n      int
}

func (w *discardWriter) Header() http.Header {
	if w.header == nil {
		w.header = http.Header{}
	}
	return w.header
}

func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += len(p)
	return len(p), nil
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAgentSweep1000: the agent's whole sweep (SweepOnce: discovery,
// polls, Apply) over 1000 fake daemons (served by a child process, each
// answering one workload with every signal, actor labels on) against its
// floor, a bare sweep of the same daemons on kept connections
// (sweep.Pool.Sweep, baseline): the ratio is what ordering and Apply add.
// cpu-us/daemon is this process's CPU (getrusage) per daemon: the agent's.
func BenchmarkAgentSweep1000(b *testing.B) {
	statsdfake.EnsureNoFile(b, benchDaemons+64)
	glob := filepath.Join(statsdfake.StartFleet(b, "TestFleetHelper", benchDaemons), "d*.sock")
	ctx := context.Background()
	run := func(b *testing.B, sweepOnce func() []sweep.DaemonResult) {
		sweepOnce() // connect them all first, as the agent's first sweep
		c0 := cpuTime(b)
		for b.Loop() {
			for _, r := range sweepOnce() {
				if r.Status != sweep.StatusOK {
					b.Fatalf("%s: %s %v", r.Socket, r.Status, r.Err)
				}
			}
		}
		b.ReportMetric(float64(cpuTime(b)-c0)/float64(time.Microsecond)/float64(b.N*benchDaemons), "cpu-us/daemon")
	}
	b.Run("baseline", func(b *testing.B) {
		pool := sweep.Config{Concurrency: 8, Timeout: 10 * time.Second}.NewPool()
		defer pool.Close()
		run(b, func() []sweep.DaemonResult {
			results, err := pool.Sweep(ctx, glob)
			if err != nil {
				b.Fatal(err)
			}
			return results
		})
	})
	b.Run("sweep-once", func(b *testing.B) {
		a, err := New(Config{Sockets: glob, Interval: time.Minute, Timeout: 10 * time.Second, Concurrency: 8,
			LabelActor: true, Grace: 10 * time.Minute}, discard())
		if err != nil {
			b.Fatal(err)
		}
		defer a.Close()
		run(b, func() []sweep.DaemonResult { return a.SweepOnce(ctx) })
	})
}

package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

const flatDaemons = 1000

// TestFleetHelper is not a test: TestFlatAcrossSweeps and
// BenchmarkAgentSweep1000 re-run the test binary with it to serve their
// 1000 fake daemons from another process.
func TestFleetHelper(t *testing.T) {
	epoch := time.Now().Add(-time.Minute)
	statsdfake.ServeFleet(t, func(i int) *sandboxstatsv1.StatsActiveWorkloadsResponse {
		s := signalSample(fmt.Sprintf("actor-%04d", i), epoch, epoch, uint64(i+1)*1_000_000)
		s.ObservedAtUnixNano = 0 // the fake stamps each answer with its time
		return &sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: []*sandboxstatsv1.WorkloadStatsSample{s}}
	})
}

// vmRSS is this process's resident set (VmRSS of /proc/self/status), bytes.
func vmRSS() (int64, error) {
	rss, _, err := testenv.ProcMemory(0)
	return rss, err
}

// peakRSS samples vmRSS every few milliseconds until stop is called, and
// takes the highest since the last take: the RSS of a sweep is its peak,
// not wherever the garbage collector's cycle was at its end.
type peakRSS struct {
	peak atomic.Int64
	err  atomic.Pointer[error]
	stop chan struct{}
}

func startPeakRSS() *peakRSS {
	p := &peakRSS{stop: make(chan struct{})}
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			p.sample()
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *peakRSS) sample() {
	rss, err := vmRSS()
	if err != nil {
		p.err.Store(&err)
		return
	}
	for old := p.peak.Load(); rss > old && !p.peak.CompareAndSwap(old, rss); old = p.peak.Load() {
	}
}

func (p *peakRSS) take(t *testing.T) int64 {
	t.Helper()
	p.sample()
	if err := p.err.Load(); err != nil {
		t.Fatal(*err)
	}
	return p.peak.Swap(0)
}

// scrapeBuffer is an http.ResponseWriter into a buffer reused from one
// scrape to the next (as a socket's would be): the test's own garbage is
// not the agent's memory.
type scrapeBuffer struct {
	bytes.Buffer
	header http.Header
	code   int
}

func (w *scrapeBuffer) Header() http.Header { return w.header }
func (w *scrapeBuffer) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *scrapeBuffer) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.Buffer.Write(p)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// TestFlatAcrossSweeps: the agent's sweep and Apply loop, in this process,
// over 1000 fake daemons (served by a child process, so this process's
// memory is the agent's) each reporting one workload with every signal,
// actor labels on (one series set per workload: the largest export), 100
// sweeps, each followed by a /metrics scrape. The agent's RSS (its peak
// within each sweep and scrape, from what it keeps between sweeps) and the
// scrape's size are flat: each of the last ten sweeps within ±10% of the
// mean of sweeps 10 to 20.
func TestFlatAcrossSweeps(t *testing.T) {
	if testing.Short() {
		t.Skip("100 sweeps over 1000 daemons: not under -short")
	}
	if raceEnabled {
		// Under -race the heap's flatness is the detector's shadow memory
		// (peak RSS 750 MiB to 1 GiB, +18% by sweep 91 on a loaded 2-core
		// machine, the 10-minute timeout reached): make test runs it without.
		t.Skip("100 sweeps over 1000 daemons: a memory bound, not under -race")
	}
	statsdfake.EnsureNoFile(t, flatDaemons+64) // a connection per daemon
	dir := statsdfake.StartFleet(t, "TestFleetHelper", flatDaemons)
	a, err := New(Config{Sockets: filepath.Join(dir, "d*.sock"), Interval: time.Minute, Timeout: 10 * time.Second,
		Concurrency: 8, LabelActor: true, Grace: 10 * time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h := a.Handler()
	req := httptest.NewRequest("GET", "/metrics", nil)
	const sweeps = 100
	rss, size := make([]int64, sweeps), make([]int64, sweeps)
	peak := startPeakRSS()
	defer close(peak.stop)
	var took time.Duration
	w := &scrapeBuffer{}
	for i := range sweeps {
		// Each sweep starts from what the agent keeps (its live heap, the
		// rest returned to the kernel): a leak still grows the peak from one
		// sweep to the next, while where the collector's pacing happened to
		// leave the heap no longer does (123-148 MiB measured without it).
		debug.FreeOSMemory()
		peak.take(t)
		start := time.Now()
		results := a.SweepOnce(context.Background())
		took += time.Since(start)
		ok := 0
		for _, r := range results {
			if r.Status == sweep.StatusOK {
				ok++
			}
		}
		if ok != flatDaemons {
			t.Fatalf("sweep %d: %d of %d daemons answered", i+1, ok, flatDaemons)
		}
		w.Reset()
		w.header, w.code = http.Header{}, 0
		h.ServeHTTP(w, req)
		if want := []byte(`actor_uid="actor-0999"`); w.code != http.StatusOK || !bytes.Contains(w.Bytes(), want) {
			t.Fatalf("sweep %d: /metrics %d (%d bytes) has no %s", i+1, w.code, w.Len(), want)
		}
		size[i], rss[i] = int64(w.Len()), peak.take(t)
	}
	series := bytes.Count(w.Bytes(), []byte("\nsandboxstats_"))
	t.Logf("1000 daemons, one workload each, actor labels: %d sandboxstats_ series, /metrics %.2f MB at sweep 100; agent peak RSS %.1f MiB at sweep 100 (%.1f to %.1f MiB from sweep 10 on); a sweep with Apply took %v on average",
		series, float64(size[sweeps-1])/1e6, mib(rss[sweeps-1]), mib(slices.Min(rss[10:])), mib(slices.Max(rss[10:])), (took / sweeps).Round(time.Millisecond))
	for _, m := range []struct {
		name string
		v    []int64
	}{{"agent RSS", rss}, {"/metrics size", size}} {
		var ref int64
		for _, v := range m.v[10:21] {
			ref += v
		}
		ref /= 11
		for i := sweeps - 10; i < sweeps; i++ {
			if d := float64(m.v[i]-ref) / float64(ref); d > 0.10 || d < -0.10 {
				t.Errorf("%s at sweep %d: %d bytes, %+.1f%% of sweeps 10-20's mean %d: not flat", m.name, i+1, m.v[i], 100*d, ref)
			}
		}
	}
}

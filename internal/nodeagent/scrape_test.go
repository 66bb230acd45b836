package nodeagent

import (
	"bytes"
	"compress/gzip"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeAgent is an Agent of 20 swept workloads (actor labels) whose live
// registry holds a counter and a gauge named between the sweep's families
// (and before them), as the discovery failures and the OTLP pipeline's
// are: deterministic, unlike the Go collector.
type scrapeAgent struct {
	a     *Agent
	m     *metrics
	t0    time.Time
	live  prometheus.Counter
	early prometheus.Gauge
}

func newScrapeAgent(t *testing.T) *scrapeAgent {
	t.Helper()
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	reg, live := prometheus.NewRegistry(), prometheus.NewRegistry()
	m, err := newMetrics(reg, metricsConfig{LabelActor: true, Grace: 10 * time.Minute, Started: t0.Add(-time.Hour), CPUs: 2}, discard())
	if err != nil {
		t.Fatal(err)
	}
	s := &scrapeAgent{a: &Agent{reg: reg, live: live, metrics: m}, m: m, t0: t0,
		live:  prometheus.NewCounter(prometheus.CounterOpts{Name: metricDiscoveryFailures, Help: "between the sweep's families"}),
		early: prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_test_gauge", Help: "before the sweep's families"})}
	live.MustRegister(s.live, s.early)
	s.sweep(0)
	return s
}

// sweep applies the i-th sweep (each workload 10 ms of CPU further).
func (s *scrapeAgent) sweep(i int) {
	results := benchResults(20, s.t0)
	at := s.t0
	for j := 0; j <= i; j++ {
		at = s.t0.Add(time.Duration(j) * time.Minute)
		advance(results, at)
	}
	s.m.Apply(results, at, time.Second)
}

// reference is today's handler: promhttp over a gatherer of its own.
func (s *scrapeAgent) reference() http.Handler {
	return promhttp.HandlerFor(&sweepGatherer{sweep: s.a.reg, live: s.a.live, metrics: s.m}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

type scraped struct {
	Code                        int
	ContentType, Encoding, Vary string
	Body                        string // decoded
	Members                     int    // gzip members
}

func scrape(t *testing.T, h http.Handler, target string, hdr map[string]string) scraped {
	t.Helper()
	req := httptest.NewRequest("GET", target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	got := scraped{Code: w.Code, ContentType: w.Header().Get("Content-Type"), Encoding: w.Header().Get("Content-Encoding"),
		Vary: strings.Join(w.Header().Values("Vary"), ",")}
	body := w.Body.Bytes()
	if got.Encoding != "gzip" {
		got.Body = string(body)
		return got
	}
	r := bytes.NewReader(body)
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatalf("scrape %s: %v", target, err)
	}
	for {
		zr.Multistream(false)
		text, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("scrape %s: gzip: %v", target, err)
		}
		got.Body += string(text)
		got.Members++
		if err := zr.Reset(r); err == io.EOF {
			return got
		} else if err != nil {
			t.Fatalf("scrape %s: gzip member: %v", target, err)
		}
	}
}

// TestScrapeAsPromhttp: the cached handler answers every negotiation as
// promhttp does today (status, Content-Type, Content-Encoding, Vary, the
// decoded body byte for byte), the first scrape of a sweep and the ones
// after, and its gzip body is one member.
func TestScrapeAsPromhttp(t *testing.T) {
	const prometheusAccept = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
	cases := []struct {
		name   string
		target string
		hdr    map[string]string
		cached string // what the cache holds after the scrapes: "", "text", "gzip"
	}{
		{"none", "/metrics", nil, "text"},
		{"prometheus", "/metrics", map[string]string{"Accept": prometheusAccept, "Accept-Encoding": "gzip"}, "gzip"},
		{"identity", "/metrics", map[string]string{"Accept-Encoding": "identity"}, "text"},
		{"gzip refused", "/metrics", map[string]string{"Accept-Encoding": "gzip;q=0, identity"}, "text"},
		{"nothing acceptable", "/metrics", map[string]string{"Accept-Encoding": "identity;q=0, *;q=0"}, "text"},
		{"star", "/metrics", map[string]string{"Accept-Encoding": "*"}, "text"}, // identity is offered first
		{"zstd only", "/metrics", map[string]string{"Accept-Encoding": "zstd"}, "text"},
		{"openmetrics only", "/metrics", map[string]string{"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}, "gzip"},
		{"protobuf", "/metrics", map[string]string{"Accept": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "Accept-Encoding": "gzip"}, "gzip"},
		{"text 1.0.0 underscores", "/metrics", map[string]string{"Accept": "text/plain;version=1.0.0;escaping=underscores"}, "text"},
		{"name filter", "/metrics?name[]=" + metricDiscoveryFailures, map[string]string{"Accept-Encoding": "gzip"}, ""},
	}
	s := newScrapeAgent(t)
	h := s.a.metricsHandler()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.sweep(i + 1)
			s.live.Inc()
			for scrapeNo := range 3 { // learning, encoding, cached
				want := scrape(t, s.reference(), c.target, c.hdr)
				got := scrape(t, h, c.target, c.hdr)
				if want.Members > 0 {
					want.Members = 1 // promhttp writes one
				}
				wantLines, gotLines := strings.Split(want.Body, "\n"), strings.Split(got.Body, "\n")
				want.Body, got.Body = "", ""
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("scrape %d (-promhttp +cached):\n%s", scrapeNo, d)
				}
				if d := cmp.Diff(wantLines, gotLines); d != "" {
					t.Fatalf("scrape %d: body (-promhttp +cached):\n%s", scrapeNo, d)
				}
			}
			cached := ""
			for _, b := range h.bodies {
				if h.key != s.m.snap.Load() {
					break // a sweep before
				}
				cached = "text"
				if b.gz != nil {
					cached = "gzip"
				}
			}
			if cached != c.cached {
				t.Errorf("cached %q, want %q", cached, c.cached)
			}
		})
	}
}

// TestScrapeLiveNotStale: between two sweeps the live families move and
// a scrape shows them as they are, while the sweep's families are the
// sweep's (encoded once: a sweep registry counter moved without a sweep
// stays as the sweep left it, as sweepGatherer served it before) until
// the next sweep.
func TestScrapeLiveNotStale(t *testing.T) {
	s := newScrapeAgent(t)
	h := s.a.Handler()
	hdr := map[string]string{"Accept-Encoding": "gzip"}
	scrape(t, h, "/metrics", hdr) // learns the encoding
	line := func(body, name string) string {
		for l := range strings.SplitSeq(body, "\n") {
			if strings.HasPrefix(l, name+" ") {
				return l
			}
		}
		t.Fatalf("no %s in:\n%s", name, body)
		return ""
	}
	first := scrape(t, h, "/metrics", hdr).Body
	s.live.Add(3)
	s.early.Set(7)
	s.m.sweeps.Add(100) // not a sweep: no new snapshot
	second := scrape(t, h, "/metrics", hdr).Body
	for _, c := range []struct{ name, before, after string }{
		{metricDiscoveryFailures, metricDiscoveryFailures + " 0", metricDiscoveryFailures + " 3"},
		{"go_test_gauge", "go_test_gauge 0", "go_test_gauge 7"},
		{"sandboxstats_agent_sweeps_total", "sandboxstats_agent_sweeps_total 1", "sandboxstats_agent_sweeps_total 1"},
	} {
		if got := []string{line(first, c.name), line(second, c.name)}; !cmp.Equal(got, []string{c.before, c.after}) {
			t.Errorf("%s: scrapes show %q, want %q", c.name, got, []string{c.before, c.after})
		}
	}
	s.sweep(1)
	if got := line(scrape(t, h, "/metrics", hdr).Body, "sandboxstats_agent_sweeps_total"); got != "sandboxstats_agent_sweeps_total 102" {
		t.Errorf("after the next sweep: %q, want sandboxstats_agent_sweeps_total 102", got)
	}
}

func TestCRC32Combine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, 100_000)
	for i := range text {
		text[i] = byte(rng.Uint32())
	}
	for _, cut := range []int{0, 1, 7, 4096, 65_537, 99_999, 100_000} {
		a, b := text[:cut], text[cut:]
		if got, want := crc32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), len(b)), crc32.ChecksumIEEE(text); got != want {
			t.Errorf("cut %d: %08x, want %08x", cut, got, want)
		}
	}
}

// TestScrapeConcurrentSweeps: scrapes in parallel with sweeps (gzip and
// identity, -race) each get a whole body of one sweep.
func TestScrapeConcurrentSweeps(t *testing.T) {
	s := newScrapeAgent(t)
	h := s.a.Handler()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		hdr := map[string]string{}
		if i%2 == 0 {
			hdr["Accept-Encoding"] = "gzip"
		}
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				got := scrape(t, h, "/metrics", hdr)
				p := expfmt.NewTextParser(model.UTF8Validation)
				if _, err := p.TextToMetricFamilies(strings.NewReader(got.Body)); err != nil || got.Members > 1 {
					t.Errorf("scrape (%v): %d gzip members, parse: %v", hdr, got.Members, err)
					return
				}
			}
		})
	}
	for i := 1; i <= 20; i++ {
		s.sweep(i)
		s.live.Inc()
	}
	close(done)
	wg.Wait()
}

package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationHostileAgentHugeFrameHeaderThenSilence: a guest agent
// answering every StatsContainer, on every connection, with a ttrpc frame
// header announcing a 100 MiB response and then nothing. Before, ttrpc
// waited for the 100 MiB: the connection was never replaced and every poll
// timed out (the read timeout) for as long as statsd ran. The header alone
// must cut the connection (redialled after a backoff), every poll must be
// answered within the read timeout, statsd must stay under 64 MiB with every
// answer and log line under 64 KiB, and polls read the agent again once it
// behaves.
func TestIntegrationHostileAgentHugeFrameHeaderThenSilence(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary against a hostile agent")
	}
	const readTimeout = 2 * time.Second // testenv.StartStatsd's --read-timeout
	bin := testenv.BuildBinaries(t)
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.HugeHeader, kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20}))
	d, stats, _ := statsdOnAgent(t, bin, driftEvery200ms, h.Address(), "web")

	// 2 pollers for about 3 s, each poll timed.
	var (
		a       answers
		mu      sync.Mutex
		slowest time.Duration
		cut     int    // answers naming the 104857600-byte frame
		example string // one of them
	)
	start := time.Now()
	pollConcurrently(2, 15, func(ctx context.Context) {
		t0 := time.Now()
		r, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm"})
		took := time.Since(t0)
		a.note("StatsWorkload", r, err)
		f, ferr := stats.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
		a.note("ListDriftFindings", f, ferr)
		mu.Lock()
		slowest = max(slowest, took)
		if text := answerText(r, err); strings.Contains(text, "104857600") {
			i := strings.Index(text, "104857600")
			cut++
			example = text[max(0, i-100):min(len(text), i+40)]
		}
		mu.Unlock()
		time.Sleep(200 * time.Millisecond)
	})
	elapsed, dials := time.Since(start), h.Dials()
	if slowest >= readTimeout {
		t.Errorf("slowest poll took %v, want every poll answered within the read timeout (%v)", slowest, readTimeout)
	}
	if cut == 0 {
		t.Errorf("no answer names the 104857600-byte frame: the header did not cut the connection")
	}
	if dials < 2 {
		t.Errorf("%d dials in %v: the wedged connection was not replaced", dials, elapsed)
	}

	// The agent behaves again: polls read it (after the backoff).
	h.SetMode(kataagentfake.Behave)
	recovered := time.Now()
	for {
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := stats.StatsWorkload(pctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm"})
		pcancel()
		a.note("StatsWorkload after the agent behaves", r, err)
		if err == nil && r.GetSample() != nil {
			break
		}
		if time.Since(recovered) > 8*time.Second {
			t.Fatalf("no sample 8 s after the agent behaves: last answer %v", answerText(r, err))
		}
		time.Sleep(100 * time.Millisecond)
	}

	rss := peakRSS(t, d)
	if rss > maxRSSBytes {
		t.Errorf("statsd peak RSS %d MiB, want under %d MiB", rss>>20, maxRSSBytes>>20)
	}
	a.check(t)
	logSize, lines := checkLog(t, d.Log)
	t.Logf("measured over %v: %d answers (%d errors), slowest poll %v, %d naming the 100 MiB frame (%q), largest answer %d bytes; "+
		"%d agent dials; a sample %v after the agent behaves; statsd peak RSS %.1f MiB; log %d bytes in %d lines",
		elapsed.Round(time.Millisecond), a.n, a.errs, slowest.Round(time.Millisecond), cut, example, a.largest,
		dials, time.Since(recovered).Round(time.Millisecond), float64(rss)/(1<<20), logSize, lines)
}

package nodeagent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// slowDaemon answers StatsActiveWorkloads with no sample after delay, as
// statsd does when a guest hangs (its reads wait for their deadline). A
// call for which hang returns true waits for the caller to give up.
type slowDaemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	delay atomic.Int64 // nanoseconds
	hang  func() bool  // nil: never
	calls atomic.Int64
}

func (d *slowDaemon) StatsActiveWorkloads(ctx context.Context, _ *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	d.calls.Add(1)
	if d.hang != nil && d.hang() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	select {
	case <-time.After(time.Duration(d.delay.Load())):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD}, nil
}

func startSlow(t *testing.T, socket string, delay time.Duration, hang func() bool) *slowDaemon {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	d := &slowDaemon{hang: hang}
	d.delay.Store(int64(delay))
	srv := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, d)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return d
}

// sweepLog is what a run of sweeps polled and skipped, by socket.
type sweepLog struct {
	polled, skipped []map[string]bool
}

func (l *sweepLog) add(res []sweep.DaemonResult) (polled, skipped int) {
	p, s := map[string]bool{}, map[string]bool{}
	for _, r := range res {
		if r.Status == sweep.StatusSkipped {
			s[r.Socket] = true
		} else {
			p[r.Socket] = true
		}
	}
	l.polled, l.skipped = append(l.polled, p), append(l.skipped, s)
	return len(p), len(s)
}

// due returns the sweep by which every daemon sweep k skipped must have
// been polled: the first whose polls, counted from sweep k+1, reach the
// number k skipped (each sweep polls a prefix of its order, and those
// skipped in k stay ahead of any skipped later); -1 if not run yet.
func (l *sweepLog) due(k int) int {
	n := 0
	for m := k + 1; m < len(l.polled); m++ {
		n += len(l.polled[m])
		if n >= len(l.skipped[k]) {
			return m
		}
	}
	return -1
}

// check reports every daemon skipped in a sweep and not polled by the sweep
// it was due in.
func (l *sweepLog) check(t *testing.T) {
	t.Helper()
	for k, skipped := range l.skipped {
		m := l.due(k)
		if m < 0 {
			continue
		}
	next:
		for s := range skipped {
			for j := k + 1; j <= m; j++ {
				if l.polled[j][s] {
					continue next
				}
			}
			t.Errorf("%s skipped in sweep %d and not polled in sweeps %d-%d (%d polls after the %d it skipped)",
				filepath.Base(s), k+1, k+2, m+1, l.count(k+1, m), len(skipped))
		}
	}
}

func (l *sweepLog) count(from, to int) (n int) {
	for j := from; j <= to; j++ {
		n += len(l.polled[j])
	}
	return n
}

// TestSweepFair: 30 daemons that answer slowly, and one healthy daemon
// that appears after the first sweep. Before: the daemons that answered
// last time went first in sorted order, so the slow ones used up every
// sweep's bound and the healthy one was skipped in every sweep (0 calls).
// Now every daemon gets its turn, those skipped last time first: counted
// in polls, not time, every daemon a sweep skipped is polled by the sweep
// in which the polls since then reach the number it skipped, whatever the
// load makes of each sweep's polls (at least Concurrency of them). The
// sweeps run until every daemon was polled since the healthy one appeared
// and that sweep's skipped were due (at most 20 sweeps: with 2 polls a
// sweep, 31 daemons take 16).
func TestSweepFair(t *testing.T) {
	dir := t.TempDir()
	var slow []*slowDaemon
	for i := range 30 {
		slow = append(slow, startSlow(t, filepath.Join(dir, fmt.Sprintf("a-slow%02d.sock", i)), 200*time.Millisecond, nil))
	}
	// 2 slots x 900 ms: at most about 9 slow polls a sweep, for 31 daemons.
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: time.Second,
		SweepTimeout: 900 * time.Millisecond, Concurrency: 2, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var log sweepLog
	log.add(a.SweepOnce(context.Background()))
	healthy := statsdfake.Start(t, filepath.Join(dir, "z-healthy.sock"))
	warm := make([]int64, len(slow))
	for i, d := range slow {
		warm[i] = d.calls.Load()
	}
	const maxSweeps = 20
	done := func() bool {
		if log.due(1) < 0 || healthy.Calls() == 0 {
			return false
		}
		for i, d := range slow {
			if d.calls.Load() == warm[i] {
				return false
			}
		}
		return true
	}
	sweeps := 0
	for ; sweeps < maxSweeps && !done(); sweeps++ {
		before := healthy.Calls()
		p, s := log.add(a.SweepOnce(context.Background()))
		t.Logf("sweep %d: %d polled, %d skipped, healthy polled %v", sweeps+2, p, s, healthy.Calls() > before)
	}
	t.Logf("healthy daemon: %d calls in %d sweeps", healthy.Calls(), sweeps)
	log.check(t)
	if healthy.Calls() == 0 {
		t.Errorf("healthy daemon: 0 calls in %d sweeps", sweeps)
	}
	for i, d := range slow {
		if d.calls.Load() == warm[i] {
			t.Errorf("slow daemon %d not polled in %d sweeps", i, sweeps)
		}
	}
}

// TestSweepSkippedBeforeQuick: a daemon skipped last sweep is polled in the
// next one, however many daemons answered quickly (within Timeout/10) in
// the last one. 40 daemons answer at once in the first two sweeps, except
// the last two calls of the second, which hang until the sweep's bound
// cuts them: all 40 are polled in it, 38 quickly, and x, new in that sweep,
// is skipped after them. In the third sweep they answer after 450 ms, just
// within a tenth of the 5 s timeout: 2 slots start at most 6 of them in its
// 1 s bound. Before (quick answerers first), those 38 filled the sweep and
// x was skipped again (and in every sweep while they kept answering so).
func TestSweepSkippedBeforeQuick(t *testing.T) {
	dir := t.TempDir()
	var phase atomic.Int64  // 1: the second sweep
	var calls2 atomic.Int64 // calls in the second sweep
	const nq = 40
	hang := func() bool { return phase.Load() == 1 && calls2.Add(1) > nq-2 }
	var quick []*slowDaemon
	for i := range nq {
		quick = append(quick, startSlow(t, filepath.Join(dir, fmt.Sprintf("q%02d.sock", i)), 0, hang))
	}
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: 5 * time.Second,
		SweepTimeout: time.Second, Concurrency: 2, Grace: time.Minute}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	x := filepath.Join(dir, "x.sock")
	status := func(res []sweep.DaemonResult) (xs sweep.Status, polled int) {
		for _, r := range res {
			if r.Socket == x {
				xs = r.Status
				if r.Status == sweep.StatusError {
					t.Logf("x: %v", r.Err)
				}
			} else if r.Status != sweep.StatusSkipped {
				polled++
			}
		}
		return xs, polled
	}
	_, p := status(a.SweepOnce(context.Background()))
	t.Logf("sweep 1: %d of %d polled", p, nq)
	xd := startSlow(t, x, 0, nil)
	phase.Store(1)
	xs, p := status(a.SweepOnce(context.Background()))
	t.Logf("sweep 2: %d of %d polled, x %s", p, nq, xs)
	if xs != sweep.StatusSkipped || p != nq {
		t.Fatalf("sweep 2: x %s and %d of %d others polled, want x skipped after all the others", xs, p, nq)
	}
	phase.Store(2)
	for _, d := range quick {
		d.delay.Store(int64(450 * time.Millisecond))
	}
	xs, p = status(a.SweepOnce(context.Background()))
	t.Logf("sweep 3: %d of %d polled, x %s (%d calls)", p, nq, xs, xd.calls.Load())
	if xs == sweep.StatusSkipped || xd.calls.Load() != 1 {
		t.Errorf("sweep 3: x %s, %d calls; want polled: it was skipped in sweep 2", xs, xd.calls.Load())
	}
}

// TestSweepOrderBound drives order and remember without daemons, as the
// worst sweep would: only the first Concurrency daemons of each order are
// polled (all answering at once, so all quick), or a random longer prefix.
// No daemon may go more than ceil(N/C)-1 sweeps in a row unpolled, and a
// daemon found mid-run is polled within ceil(N/C) sweeps of it. Before
// (quick answerers first), the first C answered quickly and stayed first:
// the rest were never polled.
func TestSweepOrderBound(t *testing.T) {
	for _, tc := range []struct {
		n, c   int
		prefix bool // a random prefix of at least c polled, not just c
	}{{31, 2, false}, {31, 2, true}, {10, 3, false}, {64, 4, true}} {
		t.Run(fmt.Sprintf("n%d-c%d-prefix%v", tc.n, tc.c, tc.prefix), func(t *testing.T) {
			a, err := New(Config{Sockets: filepath.Join(t.TempDir(), "*.sock"), Interval: time.Minute, Timeout: time.Second,
				Concurrency: tc.c, Grace: time.Minute}, discard())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			var socks []string
			for i := range tc.n {
				socks = append(socks, fmt.Sprintf("d%03d", i))
			}
			bound := (tc.n + tc.c - 1) / tc.c // sweeps, counting the one it is polled in
			waited := map[string]int{}        // sweeps in a row unpolled
			for sweepNo := range 10 * bound {
				if sweepNo == 3*bound { // a new daemon joins (one leaves)
					socks = append(socks[1:], "new")
				}
				ord := a.order(socks)
				polled := tc.c
				if tc.prefix {
					polled += (sweepNo * 7) % (tc.n - tc.c + 1)
				}
				res := make([]sweep.DaemonResult, len(ord))
				for i, s := range ord {
					res[i] = sweep.DaemonResult{Socket: s, Status: sweep.StatusNoSample, Took: time.Millisecond}
					if i >= polled {
						res[i].Status, res[i].Took = sweep.StatusSkipped, 0
					}
				}
				a.remember(res)
				for _, r := range res {
					if r.Status != sweep.StatusSkipped {
						waited[r.Socket] = 0
						continue
					}
					waited[r.Socket]++
					if w := waited[r.Socket]; w > bound-1 {
						t.Fatalf("sweep %d: %s unpolled %d sweeps in a row, want at most %d (ceil(%d/%d)-1)",
							sweepNo+1, r.Socket, w, bound-1, tc.n, tc.c)
					}
				}
			}
			if _, ok := waited["new"]; !ok {
				t.Fatal("the new daemon never swept")
			}
		})
	}
}
